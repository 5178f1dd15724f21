"""The baseline: a bare grpc.aio server with one unary method echoing bytes.

Run as ``python -m bench._echo_server --listen HOST:PORT``; stops on SIGTERM or
SIGINT. No protobuf, no database, no interceptors: the floor that any Python
gRPC server on this machine sits on.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

SERVICE = "bench.Echo"
METHOD = "Echo"
ECHO_METHOD = f"/{SERVICE}/{METHOD}"


BytesMethod = Callable[[bytes, "grpc.aio.ServicerContext[bytes, bytes]"], Awaitable[bytes]]


async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def serve_bytes_method(
    listen: str, service: str, method: str, behaviour: BytesMethod, what: str
) -> None:
    """Serve `/service/method` (bytes in, bytes out, no protobuf) on `listen` until SIGTERM or
    SIGINT; `what` names the server in its one line of output."""
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        service, {method: grpc.unary_unary_rpc_method_handler(behaviour)}
    )
    server.add_generic_rpc_handlers((handler,))
    if server.add_insecure_port(listen) == 0:
        raise SystemExit(f"cannot listen on {listen}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"{what} listening on {listen}", flush=True)
    await stop.wait()
    await server.stop(grace=1.0)


async def serve(listen: str) -> None:
    await serve_bytes_method(listen, SERVICE, METHOD, _echo, "echo server")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    args = parser.parse_args()
    asyncio.run(serve(args.listen))


if __name__ == "__main__":
    main()

"""The start-up baseline: a bare grpc.aio server with only the standard health service.

Run as ``python -m bench._health_server --listen HOST:PORT``; reports SERVING as soon as it
listens and stops on SIGTERM or SIGINT. What any Python gRPC server on this machine needs to
start: the interpreter, grpcio and grpcio-health-checking.

``--import MODULE`` (repeatable) imports modules first, with the garbage collector off as the
sidecar's start has it: with the libraries the sidecar cannot start without, the same server
is the floor any start of the sidecar stands on, whatever its own code does.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import signal

import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


async def serve(listen: str) -> None:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    if server.add_insecure_port(listen) == 0:
        raise SystemExit(f"cannot listen on {listen}")
    await server.start()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    parser.add_argument("--import", dest="modules", action="append", default=[], help="MODULE")
    arguments = parser.parse_args()
    gc.disable()
    for module in arguments.modules:
        importlib.import_module(module)
    gc.enable()
    asyncio.run(serve(arguments.listen))


if __name__ == "__main__":
    main()

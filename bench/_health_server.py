"""The start-up baseline: a bare grpc.aio server with only the standard health service.

Run as ``python -m bench._health_server --listen HOST:PORT``; reports SERVING as soon as it
listens and stops on SIGTERM or SIGINT. What any Python gRPC server on this machine needs to
start: the interpreter, grpcio and grpcio-health-checking.
"""

from __future__ import annotations

import argparse
import asyncio
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
    asyncio.run(serve(parser.parse_args().listen))


if __name__ == "__main__":
    main()

"""Helpers for tests that connect the sidecar to real MCP servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from tests.conftest import RunningSidecar, Stubs

T = TypeVar("T")

FIXTURE_SERVER = Path(__file__).parent / "mcp_servers" / "fixture_server.py"
ROOT = Path(__file__).parent.parent
PEERS_DIR = ROOT / "tests" / "mcp-peers" / "node_modules"

# How long a test waits for something the sidecar does in the background (a reconnect, a
# refresh) before it fails. A correct sidecar gets there in well under a second.
SETTLE_SECONDS = 30.0


def fixture_commands() -> dict[str, Any]:
    """The operator-allowed commands of a test sidecar: the fixture server over stdio."""
    return {
        "fixture": {
            "argv": [sys.executable, str(FIXTURE_SERVER), "stdio"],
            "allow_extra_args": True,
            # The fixture server reads FIXTURE_TOKEN; nothing else may be set.
            "allowed_env": ["FIXTURE_*"],
        },
        "fixture-fixed": {"argv": [sys.executable, str(FIXTURE_SERVER), "stdio"]},
    }


def put_stdio(
    stubs: Stubs,
    tenant: str,
    name: str,
    command: str = "fixture",
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    **fields: Any,
) -> connection_pb2.Connection:
    connection = connection_pb2.Connection(
        tenant=tenant,
        name=name,
        stdio=connection_pb2.StdioTransport(command=command, args=list(args), env=env or {}),
        **fields,
    )
    request = connection_service_pb2.PutConnectionRequest(connection=connection)
    return stubs.connections.PutConnection(request).connection


def put_http(
    stubs: Stubs,
    tenant: str,
    name: str,
    url: str,
    headers: Mapping[str, str] | None = None,
    protocol: int = connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
    **fields: Any,
) -> connection_pb2.Connection:
    connection = connection_pb2.Connection(
        tenant=tenant,
        name=name,
        http=connection_pb2.HttpTransport(url=url, headers=headers or {}, protocol=protocol),
        **fields,
    )
    request = connection_service_pb2.PutConnectionRequest(connection=connection)
    return stubs.connections.PutConnection(request).connection


def catalog_names(stubs: Stubs, tenant: str, name: str, version: int = 0) -> list[str]:
    names: list[str] = []
    token = ""
    while True:
        page = stubs.connections.ListCatalogTools(
            connection_service_pb2.ListCatalogToolsRequest(
                tenant=tenant, name=name, catalog_version=version, page_token=token
            )
        )
        names.extend(tool.name for tool in page.tools)
        token = page.next_page_token
        if not token:
            return names


def listed(stubs: Stubs, tenant: str) -> dict[str, connection_pb2.Connection]:
    response = stubs.connections.ListConnections(
        connection_service_pb2.ListConnectionsRequest(tenant=tenant, page_size=1000)
    )
    return {connection.name: connection for connection in response.connections}


def wait_for(condition: Callable[[], T], what: str) -> T:
    """Poll until `condition()` is truthy; fail if it never becomes so."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def on_loop(sidecar: RunningSidecar, coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the sidecar's own event loop (the MCP sessions live there)."""
    return asyncio.run_coroutine_threadsafe(coroutine, sidecar.loop).result(120)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    def accepting() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode} before listening")
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    wait_for(accepting, f"a server listening on port {port}")


class HttpServer:
    """A server process listening on a loopback port, which a test can kill and restart."""

    def __init__(self, argv: Sequence[str], port: int, env: Mapping[str, str] | None = None):
        self.argv = list(argv)
        self.port = port
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HttpServer:
        self.process = subprocess.Popen(self.argv, env=self.env, start_new_session=True)
        wait_for_port(self.port, self.process)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def fixture_http(port: int, *extra: str) -> HttpServer:
    return HttpServer(
        [sys.executable, str(FIXTURE_SERVER), "http", "--port", str(port), *extra], port
    )


@contextlib.contextmanager
def running(server: HttpServer) -> Iterator[HttpServer]:
    """The server, started; killed on the way out."""
    server.start()
    try:
        yield server
    finally:
        server.kill()

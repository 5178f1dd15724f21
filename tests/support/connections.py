"""Connecting the sidecar to real MCP servers: the project's fixture server and the peers."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from tests.support.processes import HttpServer
from tests.support.sidecar import Stubs

TESTS = Path(__file__).parent.parent
FIXTURE_SERVER = TESTS / "mcp_servers" / "fixture_server.py"
PEERS_DIR = TESTS / "mcp-peers" / "node_modules"


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
        http=connection_pb2.HttpTransport(
            url=url,
            headers=headers or {},
            # A plain int from a caller (a parametrized test) as the enum's value type.
            protocol=connection_pb2.HttpProtocol.ValueType(protocol),
        ),
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


def fixture_http(port: int, *extra: str) -> HttpServer:
    return HttpServer(
        [sys.executable, str(FIXTURE_SERVER), "http", "--port", str(port), *extra], port
    )

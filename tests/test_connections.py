"""ConnectionService and the MCP layer against the project's own MCP server, run for real
(stdio and streamable HTTP), through the real sidecar on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import grpc
import pytest

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from psych_sidecar.config import Settings
from psych_sidecar.domain.catalog import (
    ConnectionState,
    McpToolRequest,
    McpToolResult,
    ToolCallFailed,
)
from psych_sidecar.domain.runlog import PartKind
from tests.mcp_servers.fixture_server import BLOB_BYTES, FIXED_TOOLS, PNG_BYTES, WAV_BYTES
from tests.support.connections import (
    catalog_names,
    fixture_commands,
    fixture_http,
    listed,
    put_http,
    put_stdio,
)
from tests.support.polling import wait_for
from tests.support.processes import free_port, running
from tests.support.sidecar import RunningSidecar, Stubs, on_loop, rpc_failure

FIXED_NAMES = sorted(tool.name for tool in FIXED_TOOLS)
SMALL = ["--tools", "3"]
BULK3 = ["bulk_000", "bulk_001", "bulk_002"]


# One listener is enough here: these tests are about MCP, not the gRPC transport.
SIDECAR_TRANSPORTS = ["unix"]


# The fixture server is an allowed command; reconnects, debounce and the TTL are short so that
# background behaviour shows up quickly.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": fixture_commands(),
    "mcp_reconnect_min_seconds": 0.1,
    "mcp_reconnect_max_seconds": 0.5,
    "mcp_list_changed_debounce_seconds": 0.05,
    "mcp_connect_timeout_seconds": 20,
    "catalog_ttl_seconds": 1.0,
}


def call(
    server: RunningSidecar,
    tenant: str,
    connection: str,
    tool: str,
    arguments: dict[str, Any] | None = None,
    timeout: float = 20,
) -> McpToolResult:
    runner = server.sidecar.tool_runner
    request = McpToolRequest(tenant=tenant, server=connection, tool=tool, arguments=arguments or {})
    result = on_loop(server, runner.call_tool(request, timeout))
    assert isinstance(result, McpToolResult), result  # none of these tools asks for input
    return result


def text_of(result: McpToolResult) -> str:
    assert result.content[0].kind is PartKind.TEXT
    return result.content[0].as_text()


def state_of(stubs: Stubs, tenant: str, name: str) -> int:
    return listed(stubs, tenant)[name].state


# Connecting and listing


def test_put_connects_and_lists_every_page_of_tools(stubs: Stubs, tenant: str) -> None:
    connection = put_stdio(stubs, tenant, "paged", args=["--tools", "250", "--page-size", "50"])
    assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED
    assert connection.catalog_version == 1
    assert connection.stdio.command == "fixture"
    assert list(connection.stdio.args) == ["--tools", "250", "--page-size", "50"]
    bulk = [f"bulk_{index:03d}" for index in range(250)]
    assert catalog_names(stubs, tenant, "paged") == sorted([*FIXED_NAMES, *bulk])


def test_catalog_pages_are_sorted_and_token_bound(stubs: Stubs, tenant: str) -> None:
    put_stdio(stubs, tenant, "small", args=SMALL)
    names: list[str] = []
    token = ""
    pages = 0
    while True:
        page = stubs.connections.ListCatalogTools(
            connection_service_pb2.ListCatalogToolsRequest(
                tenant=tenant, name="small", page_size=4, page_token=token
            )
        )
        assert len(page.tools) <= 4
        assert {tool.catalog_version for tool in page.tools} == {1}
        assert {tool.removed_in_version for tool in page.tools} == {0}
        names.extend(tool.name for tool in page.tools)
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert names == sorted([*FIXED_NAMES, "bulk_000", "bulk_001", "bulk_002"])
    assert pages == -(-len(names) // 4)
    first = stubs.connections.ListCatalogTools(
        connection_service_pb2.ListCatalogToolsRequest(tenant=tenant, name="small", page_size=4)
    )
    elsewhere = connection_service_pb2.ListCatalogToolsRequest(
        tenant=tenant, name="small", catalog_version=1, page_token=first.next_page_token
    )
    failure = rpc_failure(lambda: stubs.connections.ListCatalogTools(elsewhere))
    assert failure.info.reason == "FIELD_INVALID"
    assert failure.info.metadata["field"] == "page_token"


def test_schemas_are_the_servers_json(stubs: Stubs, tenant: str) -> None:
    put_stdio(stubs, tenant, "schemas", args=SMALL)
    page = stubs.connections.ListCatalogTools(
        connection_service_pb2.ListCatalogToolsRequest(tenant=tenant, name="schemas")
    )
    tools = {tool.name: tool for tool in page.tools}
    assert tools["echo"].input_schema_json == (
        b'{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}'
    )
    assert tools["echo"].output_schema_json == b""
    assert tools["structured"].output_schema_json.startswith(b'{"type":"object"')
    assert tools["echo"].description == "Returns its text argument."
    assert tools["echo"].server == "schemas"


def test_a_connection_put_between_two_reads_is_in_the_catalog_view(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    view = grpc_server.sidecar.catalog
    put_stdio(stubs, tenant, "first", args=SMALL)
    before = view.tenant_connections(tenant)
    assert [connection.name for connection, _ in before] == ["first"]
    put_stdio(stubs, tenant, "second", args=SMALL, description="Arrives mid-Run.")
    after = dict((c.name, (c, status)) for c, status in view.tenant_connections(tenant))
    assert list(after) == ["first", "second"]
    connection, status = after["second"]
    assert status.state is ConnectionState.CONNECTED
    assert status.catalog_version == 1
    assert connection.description == "Arrives mid-Run."
    tools = view.current_tools(tenant, "second")
    assert [tool.name for tool in tools] == sorted(
        [*FIXED_NAMES, "bulk_000", "bulk_001", "bulk_002"]
    )
    assert {tool.removed_in_version for tool in tools} == {0}
    assert text_of(call(grpc_server, tenant, "second", "echo", {"text": "hi"})) == "hi"


def test_tenants_see_only_their_own_connections(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str, unique: Callable[[str], str]
) -> None:
    put_stdio(stubs, tenant, "mine", args=SMALL)
    other = unique("other")
    assert listed(stubs, other) == {}
    assert grpc_server.sidecar.catalog.tenant_connections(other) == []
    assert grpc_server.sidecar.catalog.current_tools(other, "mine") == []
    with pytest.raises(ToolCallFailed, match="no MCP server named 'mine'"):
        call(grpc_server, other, "mine", "echo", {"text": "x"})


# The refresh triggers


@pytest.mark.parametrize(("era", "version"), [("auto", "2026-07-28"), ("legacy", "2025-11-25")])
def test_tools_list_changed_refreshes_the_catalogue_in_both_protocol_eras(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str, era: str, version: str
) -> None:
    put_stdio(stubs, tenant, "changing", args=[*SMALL, "--era", era])
    assert text_of(call(grpc_server, tenant, "changing", "protocol_version")) == version
    call(grpc_server, tenant, "changing", "add_tool", {"name": "fresh"})
    wait_for(lambda: "fresh" in catalog_names(stubs, tenant, "changing"), "the new tool")
    assert listed(stubs, tenant)["changing"].catalog_version == 2
    diff = stubs.connections.DiffCatalog(
        connection_service_pb2.DiffCatalogRequest(tenant=tenant, name="changing", from_version=1)
    )
    assert [tool.name for tool in diff.added] == ["fresh"]
    assert list(diff.changed) == []
    assert list(diff.removed) == []


def test_the_ttl_sweep_catches_a_change_nobody_announced(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    put_stdio(stubs, tenant, "quiet", args=SMALL)
    call(grpc_server, tenant, "quiet", "add_tool", {"name": "unannounced", "notify": False})
    wait_for(lambda: "unannounced" in catalog_names(stubs, tenant, "quiet"), "the TTL sweep")


def test_refresh_on_demand_writes_a_version_only_when_the_listing_changed(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    put_stdio(stubs, tenant, "demand", args=SMALL)
    request = connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="demand")
    unchanged = stubs.connections.RefreshCatalog(request)
    assert unchanged.catalog_version == 1
    assert unchanged.tool_count == len(FIXED_NAMES) + 3
    call(grpc_server, tenant, "demand", "add_tool", {"name": "later", "notify": False})
    # Concurrent refreshes are serialised per connection: all succeed, one version results.
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: stubs.connections.RefreshCatalog(request), range(8)))
    assert {answer.catalog_version for answer in answers} == {2}
    assert {answer.tool_count for answer in answers} == {len(FIXED_NAMES) + 4}
    assert "later" in catalog_names(stubs, tenant, "demand")


# Versions and diffs


def test_every_version_reads_back_and_versions_diff(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    put_stdio(stubs, tenant, "versions", args=SMALL)
    refresh = connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="versions")

    def change(tool: str, arguments: dict[str, Any]) -> int:
        call(grpc_server, tenant, "versions", tool, {**arguments, "notify": False})
        return stubs.connections.RefreshCatalog(refresh).catalog_version

    assert change("add_tool", {"name": "a", "description": "one"}) == 2
    assert change("add_tool", {"name": "a", "description": "two"}) == 3
    assert change("remove_tool", {"name": "a"}) == 4
    base = sorted([*FIXED_NAMES, "bulk_000", "bulk_001", "bulk_002"])
    assert catalog_names(stubs, tenant, "versions", 1) == base
    assert catalog_names(stubs, tenant, "versions", 2) == sorted([*base, "a"])
    assert catalog_names(stubs, tenant, "versions", 4) == base
    assert catalog_names(stubs, tenant, "versions") == base
    version_two = stubs.connections.ListCatalogTools(
        connection_service_pb2.ListCatalogToolsRequest(
            tenant=tenant, name="versions", catalog_version=2, page_size=1000
        )
    )
    added = next(tool for tool in version_two.tools if tool.name == "a")
    assert (added.description, added.catalog_version, added.removed_in_version) == ("one", 2, 3)

    def diff(from_version: int, to_version: int) -> connection_service_pb2.DiffCatalogResponse:
        return stubs.connections.DiffCatalog(
            connection_service_pb2.DiffCatalogRequest(
                tenant=tenant, name="versions", from_version=from_version, to_version=to_version
            )
        )

    assert [tool.name for tool in diff(1, 2).added] == ["a"]
    changed = diff(2, 3).changed
    assert [(tool.name, tool.description) for tool in changed] == [("a", "two")]
    removed = diff(3, 4).removed
    assert [(tool.name, tool.description) for tool in removed] == [("a", "two")]
    assert diff(1, 4) == connection_service_pb2.DiffCatalogResponse()
    assert [tool.name for tool in diff(4, 2).added] == ["a"]


def test_unknown_versions_and_connections_are_not_found(stubs: Stubs, tenant: str) -> None:
    put_stdio(stubs, tenant, "known", args=SMALL)
    failure = rpc_failure(
        lambda: stubs.connections.ListCatalogTools(
            connection_service_pb2.ListCatalogToolsRequest(
                tenant=tenant, name="known", catalog_version=99
            )
        )
    )
    assert failure.code == grpc.StatusCode.NOT_FOUND
    assert failure.info.reason == "CATALOG_VERSION_NOT_FOUND"
    assert failure.info.metadata == {"connection": "known", "catalog_version": "99"}
    for call_rpc in [
        lambda: stubs.connections.ListCatalogTools(
            connection_service_pb2.ListCatalogToolsRequest(tenant=tenant, name="nope")
        ),
        lambda: stubs.connections.DiffCatalog(
            connection_service_pb2.DiffCatalogRequest(tenant=tenant, name="nope", from_version=1)
        ),
        lambda: stubs.connections.RefreshCatalog(
            connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="nope")
        ),
        lambda: stubs.connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant=tenant, name="nope")
        ),
    ]:
        failure = rpc_failure(call_rpc)
        assert failure.code == grpc.StatusCode.NOT_FOUND
        assert failure.info.reason == "CONNECTION_NOT_FOUND"
        assert failure.info.metadata == {"tenant": tenant, "connection": "nope"}
    failure = rpc_failure(
        lambda: stubs.connections.DiffCatalog(
            connection_service_pb2.DiffCatalogRequest(tenant=tenant, name="known")
        )
    )
    assert (failure.info.reason, failure.info.metadata["field"]) == (
        "FIELD_REQUIRED",
        "from_version",
    )


def test_delete_takes_tools_off_every_surface_but_keeps_versions_readable(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    put_stdio(stubs, tenant, "gone", args=SMALL)
    stubs.connections.DeleteConnection(
        connection_service_pb2.DeleteConnectionRequest(tenant=tenant, name="gone")
    )
    assert "gone" not in listed(stubs, tenant)
    assert grpc_server.sidecar.catalog.tenant_connections(tenant) == []
    assert grpc_server.sidecar.catalog.current_tools(tenant, "gone") == []
    assert catalog_names(stubs, tenant, "gone") == []
    assert "echo" in catalog_names(stubs, tenant, "gone", 1)
    with pytest.raises(ToolCallFailed):
        call(grpc_server, tenant, "gone", "echo", {"text": "x"})
    # A new connection of the same name continues the numbering: old versions stay intact.
    again = put_stdio(stubs, tenant, "gone", args=["--tools", "1"])
    assert again.catalog_version == 3
    assert "bulk_002" in catalog_names(stubs, tenant, "gone", 1)
    assert "bulk_002" not in catalog_names(stubs, tenant, "gone")


def test_list_connections_pages_by_name(stubs: Stubs, tenant: str) -> None:
    names = ["b-conn", "a.conn", "c_conn", "A-conn", "z9"]
    for name in names:
        # Nothing listens on port 9: each put's first attempt fails fast.
        put_http(stubs, tenant, name, "http://127.0.0.1:9/mcp")
    seen: list[str] = []
    token = ""
    while True:
        page = stubs.connections.ListConnections(
            connection_service_pb2.ListConnectionsRequest(
                tenant=tenant, page_size=2, page_token=token
            )
        )
        assert len(page.connections) <= 2
        seen.extend(connection.name for connection in page.connections)
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted(names)
    first = stubs.connections.ListConnections(
        connection_service_pb2.ListConnectionsRequest(tenant=tenant, page_size=2)
    )
    failure = rpc_failure(
        lambda: stubs.connections.ListConnections(
            connection_service_pb2.ListConnectionsRequest(
                tenant=tenant + "x", page_token=first.next_page_token
            )
        )
    )
    assert failure.info.reason == "FIELD_INVALID"


# Unreachable servers


def test_a_killed_http_server_is_unreachable_keeps_its_tools_and_comes_back(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    port = free_port()
    server = fixture_http(port, *SMALL)
    url = f"http://127.0.0.1:{port}/mcp"
    view = grpc_server.sidecar.catalog
    with running(server):
        put = put_http(stubs, tenant, "remote", url)
        assert put.state == connection_pb2.CONNECTION_STATE_CONNECTED
        assert put.http.url == url
        assert put.http.protocol == connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP
        tools_before = catalog_names(stubs, tenant, "remote")
        assert text_of(call(grpc_server, tenant, "remote", "echo", {"text": "up"})) == "up"
    # The server is gone: a call fails cleanly, as a message the model can act on.
    with pytest.raises(ToolCallFailed, match="'remote'"):
        call(grpc_server, tenant, "remote", "echo", {"text": "down"}, timeout=5)
    wait_for(
        lambda: state_of(stubs, tenant, "remote") == connection_pb2.CONNECTION_STATE_UNREACHABLE,
        "the connection to be reported unreachable",
    )
    down = listed(stubs, tenant)["remote"]
    assert down.last_error
    failure = rpc_failure(
        lambda: stubs.connections.RefreshCatalog(
            connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="remote")
        )
    )
    assert failure.code == grpc.StatusCode.UNAVAILABLE
    assert failure.info.reason == "CONNECTION_UNREACHABLE"
    assert failure.info.metadata["connection"] == "remote"
    # A failed refresh removes nothing: the last known tools stay, in storage and the view.
    assert catalog_names(stubs, tenant, "remote") == tools_before
    assert [t.name for t in view.current_tools(tenant, "remote")] == tools_before
    status = dict((c.name, s) for c, s in view.tenant_connections(tenant))["remote"]
    assert status.state is ConnectionState.UNREACHABLE
    assert status.catalog_version == 1
    with pytest.raises(ToolCallFailed, match="unreachable since"):
        call(grpc_server, tenant, "remote", "echo", {"text": "down"})
    # Restarting the server brings the connection back, by reconnecting with backoff.
    with running(fixture_http(port, *SMALL)):
        wait_for(
            lambda: state_of(stubs, tenant, "remote") == connection_pb2.CONNECTION_STATE_CONNECTED,
            "the reconnection",
        )
        assert text_of(call(grpc_server, tenant, "remote", "echo", {"text": "back"})) == "back"
        assert listed(stubs, tenant)["remote"].last_error == ""


def test_a_stdio_server_dying_mid_call_fails_the_call_and_is_restarted(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    put_stdio(stubs, tenant, "mortal", args=SMALL)
    first_pid = int(text_of(call(grpc_server, tenant, "mortal", "pid")))
    with pytest.raises(ToolCallFailed, match="closed during the call to 'exit'"):
        call(grpc_server, tenant, "mortal", "exit")
    assert listed(stubs, tenant)["mortal"].last_error == "the connection closed"
    wait_for(
        lambda: state_of(stubs, tenant, "mortal") == connection_pb2.CONNECTION_STATE_CONNECTED,
        "the reconnection",
    )
    second_pid = int(text_of(call(grpc_server, tenant, "mortal", "pid")))
    assert second_pid != first_pid
    os.kill(second_pid, signal.SIGKILL)

    def restarted() -> bool:
        try:
            return text_of(call(grpc_server, tenant, "mortal", "pid")) != str(second_pid)
        except ToolCallFailed:
            return False

    wait_for(restarted, "a new server process")
    assert listed(stubs, tenant)["mortal"].catalog_version == 1


def test_a_server_that_cannot_start_is_unreachable_with_its_error(
    stubs: Stubs, tenant: str
) -> None:
    connection = put_stdio(stubs, tenant, "broken", args=["--no-such-flag"])
    assert connection.state == connection_pb2.CONNECTION_STATE_UNREACHABLE
    assert connection.last_error
    assert connection.catalog_version == 0
    assert catalog_names(stubs, tenant, "broken") == []


# Results


def test_results_of_every_kind_become_log_parts(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    put_stdio(stubs, tenant, "kinds", args=SMALL)

    def run(tool: str) -> McpToolResult:
        return call(grpc_server, tenant, "kinds", tool)

    image = run("image")
    assert not image.is_error
    assert [(p.kind, p.mime_type, p.data) for p in image.content] == [
        (PartKind.BINARY, "image/png", PNG_BYTES)
    ]
    assert b'"type":"image"' in image.result_json
    audio = run("audio").content[0]
    assert (audio.kind, audio.mime_type, audio.data) == (PartKind.BINARY, "audio/wav", WAV_BYTES)
    blob = run("blob").content[0]
    assert (blob.kind, blob.mime_type, blob.data) == (
        PartKind.BINARY,
        "application/octet-stream",
        BLOB_BYTES,
    )
    assert text_of(run("resource_text")) == "embedded notes"
    link = run("resource_link").content[0]
    assert link.kind is PartKind.JSON
    assert b'"uri":"file:///report.pdf"' in link.data
    structured = run("structured")
    assert [(p.kind, p.data) for p in structured.content] == [
        (PartKind.TEXT, b'{"answer": 42}'),
        (PartKind.JSON, b'{"answer":42}'),
    ]
    assert b'"structuredContent":{"answer":42}' in structured.result_json
    refused = run("tool_error")
    assert refused.is_error
    assert text_of(refused) == "bad input: value must be positive"
    assert b'"isError":true' in refused.result_json


def test_failures_are_tool_call_errors_and_the_session_survives_them(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    put_stdio(stubs, tenant, "failing", args=SMALL)
    with pytest.raises(ToolCallFailed, match=r"did not answer 'hang' within 0\.5 seconds"):
        call(grpc_server, tenant, "failing", "hang", timeout=0.5)
    with pytest.raises(ToolCallFailed, match="answered the call to 'fail' with error"):
        call(grpc_server, tenant, "failing", "fail")
    assert text_of(call(grpc_server, tenant, "failing", "echo", {"text": "alive"})) == "alive"
    assert state_of(stubs, tenant, "failing") == connection_pb2.CONNECTION_STATE_CONNECTED


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_huge_text_result_arrives_whole(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str, transport: str
) -> None:
    size = 20_000_000
    if transport == "stdio":
        put_stdio(stubs, tenant, "huge", args=SMALL)
        result = call(grpc_server, tenant, "huge", "huge_text", {"size": size}, timeout=120)
    else:
        port = free_port()
        with running(fixture_http(port, *SMALL)):
            put_http(stubs, tenant, "huge", f"http://127.0.0.1:{port}/mcp")
            result = call(grpc_server, tenant, "huge", "huge_text", {"size": size}, timeout=120)
    assert len(result.content[0].data) == size
    assert result.content[0].data == b"x" * size


# Secrets and validation


def test_secrets_are_used_but_never_returned_or_logged(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    env_secret, header_secret = "sekret-env-3141", "sekret-header-2718"
    stdio = put_stdio(stubs, tenant, "envy", args=SMALL, env={"FIXTURE_TOKEN": env_secret})
    assert text_of(call(grpc_server, tenant, "envy", "getenv", {"name": "FIXTURE_TOKEN"})) == (
        env_secret
    )
    port = free_port()
    with running(fixture_http(port, *SMALL)):
        http = put_http(
            stubs,
            tenant,
            "heady",
            f"http://127.0.0.1:{port}/mcp",
            headers={"Authorization": f"Bearer {header_secret}"},
        )
        assert http.state == connection_pb2.CONNECTION_STATE_CONNECTED
    # An unreachable server's error and a failed put are logged too: still no secrets.
    put_http(stubs, tenant, "nowhere", "http://127.0.0.1:9/mcp", headers={"X-Key": header_secret})
    rpc_failure(lambda: put_stdio(stubs, tenant, "denied", command="bash", env={"T": env_secret}))
    replies = [
        stdio.SerializeToString(),
        http.SerializeToString(),
        stubs.connections.ListConnections(
            connection_service_pb2.ListConnectionsRequest(tenant=tenant)
        ).SerializeToString(),
    ]
    for reply in replies:
        assert env_secret.encode() not in reply
        assert header_secret.encode() not in reply
    assert not stdio.stdio.env
    assert not http.http.headers
    for connection, _status in grpc_server.sidecar.catalog.tenant_connections(tenant):
        assert not connection.env
        assert not connection.headers
        assert env_secret not in repr(connection)
    assert env_secret not in caplog.text
    assert header_secret not in caplog.text


@pytest.mark.parametrize(
    ("connection", "code", "reason", "field"),
    [
        (
            connection_pb2.Connection(tenant="t", name="n"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_REQUIRED",
            "connection.transport",
        ),
        (
            connection_pb2.Connection(
                tenant="t", name="n", http=connection_pb2.HttpTransport(url="http://h/mcp")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_INVALID",
            "connection.http.protocol",
        ),
        (
            connection_pb2.Connection(
                tenant="t",
                name="n",
                http=connection_pb2.HttpTransport(
                    protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP
                ),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_REQUIRED",
            "connection.http.url",
        ),
        (
            connection_pb2.Connection(
                tenant="t",
                name="n",
                http=connection_pb2.HttpTransport(
                    url="file:///etc/passwd", protocol=connection_pb2.HTTP_PROTOCOL_SSE
                ),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_INVALID",
            "connection.http.url",
        ),
        (
            connection_pb2.Connection(
                tenant="t",
                name="n",
                http=connection_pb2.HttpTransport(
                    url="http://h/mcp",
                    protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
                    headers={"X-Key": "secret\r\nInjected: 1"},
                ),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_INVALID",
            "connection.http.headers['X-Key']",
        ),
        (
            connection_pb2.Connection(
                tenant="t",
                name="n",
                stdio=connection_pb2.StdioTransport(command="fixture", env={"A=B": "secret"}),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_INVALID",
            "connection.stdio.env['A=B']",
        ),
        (
            connection_pb2.Connection(
                tenant="t", name="n", stdio=connection_pb2.StdioTransport(command="")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_REQUIRED",
            "connection.stdio.command",
        ),
        (
            connection_pb2.Connection(
                tenant="t",
                name="n",
                stdio=connection_pb2.StdioTransport(command="fixture-fixed", args=["--tools", "1"]),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_INVALID",
            "connection.stdio.args",
        ),
        (
            connection_pb2.Connection(
                tenant="t", name="has space", stdio=connection_pb2.StdioTransport(command="fixture")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_INVALID",
            "connection.name",
        ),
        (
            connection_pb2.Connection(
                tenant="t", name="n" * 65, stdio=connection_pb2.StdioTransport(command="fixture")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_INVALID",
            "connection.name",
        ),
        (
            connection_pb2.Connection(
                name="n", stdio=connection_pb2.StdioTransport(command="fixture")
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_REQUIRED",
            "connection.tenant",
        ),
        (
            connection_pb2.Connection(
                tenant="t",
                name="n",
                stdio=connection_pb2.StdioTransport(command="fixture"),
                eager_tools=["echo", ""],
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_REQUIRED",
            "connection.eager_tools[1]",
        ),
    ],
)
def test_put_connection_refuses_what_could_never_work(
    stubs: Stubs,
    connection: connection_pb2.Connection,
    code: grpc.StatusCode,
    reason: str,
    field: str,
) -> None:
    failure = rpc_failure(
        lambda: stubs.connections.PutConnection(
            connection_service_pb2.PutConnectionRequest(connection=connection)
        )
    )
    assert (failure.code, failure.info.reason, failure.info.metadata["field"]) == (
        code,
        reason,
        field,
    )
    assert "secret" not in failure.message


def test_a_command_the_operator_did_not_allow_is_refused_and_changes_nothing(
    stubs: Stubs, tenant: str
) -> None:
    put_stdio(stubs, tenant, "kept", args=SMALL, description="the original")
    for command in ["bash", "/usr/bin/python3", "fixture " + "--tools 1"]:
        failure = rpc_failure(partial(put_stdio, stubs, tenant, "kept", command))
        assert failure.code == grpc.StatusCode.PERMISSION_DENIED
        assert failure.info.reason == "COMMAND_NOT_ALLOWED"
        assert failure.info.metadata == {"command": command}
    kept = listed(stubs, tenant)["kept"]
    assert (kept.stdio.command, kept.description) == ("fixture", "the original")
    assert kept.state == connection_pb2.CONNECTION_STATE_CONNECTED
    failure = rpc_failure(
        lambda: stubs.connections.PutConnection(connection_service_pb2.PutConnectionRequest())
    )
    assert (failure.info.reason, failure.info.metadata["field"]) == (
        "FIELD_REQUIRED",
        "connection",
    )


def test_fields_round_trip_and_the_description_is_stored_whole(stubs: Stubs, tenant: str) -> None:
    description = "d" * 450
    put = put_stdio(
        stubs,
        tenant,
        "fields",
        args=SMALL,
        preload=False,
        eager_tools=["echo"],
        description=description,
        allow_tools=["e*", "bulk_*"],
        deny_tools=["bulk_001"],
    )
    for connection in [put, listed(stubs, tenant)["fields"]]:
        assert connection.HasField("preload")
        assert connection.preload is False
        assert list(connection.eager_tools) == ["echo"]
        assert connection.description == description
        assert list(connection.allow_tools) == ["e*", "bulk_*"]
        assert list(connection.deny_tools) == ["bulk_001"]
    unset = put_stdio(stubs, tenant, "unset", args=SMALL)
    assert not unset.HasField("preload")


# Restart and several sidecars


def test_a_new_sidecar_on_the_same_database_reconnects_stored_connections(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str, tmp_path: Any
) -> None:
    put_stdio(stubs, tenant, "durable", args=SMALL, env={"FIXTURE_TOKEN": "from-storage"})
    settings = Settings(
        **{
            **grpc_server.settings.model_dump(),
            "listen": [f"unix://{tmp_path / 'second.sock'}"],
            "data_dir": tmp_path,
        }
    )
    with RunningSidecar(settings) as second:
        view = second.sidecar.catalog

        def connected() -> bool:
            states = {c.name: s.state for c, s in view.tenant_connections(tenant)}
            return states.get("durable") is ConnectionState.CONNECTED

        wait_for(connected, "the second sidecar's session")
        token = call(second, tenant, "durable", "getenv", {"name": "FIXTURE_TOKEN"})
        assert text_of(token) == "from-storage"
        # A connection put through the first sidecar is usable through the second.
        put_stdio(stubs, tenant, "later", args=SMALL)
        result = call(second, tenant, "later", "echo", {"text": "seen"})
        assert text_of(result) == "seen"

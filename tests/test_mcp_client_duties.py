"""What MCP 2026-07-28 asks of a client beyond calls themselves (docs/mcp-2026-07-28.md), against
the project's own MCP server run for real: a listing's `ttlMs` brings its re-listing forward
(never back past the sweep's bound), a tool whose name is outside the spec's naming rules is
catalogued and called, every request carries the standard headers that a server refusing their
absence asks for, and a `null` argument is the server's to judge."""

from __future__ import annotations

import json
import math
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import struct_pb2

from psych.sidecar.v1 import run_service_pb2, spec_pb2, tool_service_pb2
from psych_sidecar.domain.catalog import McpToolRequest
from psych_sidecar.mcp.catalog_refresh import stale_after
from psych_sidecar.mcp.session_types import SessionTimings
from tests.mcp_servers.fixture_server import ODD_NAME_TOOL
from tests.support.connections import (
    FIXTURE_SERVER,
    catalog_names,
    fixture_commands,
    put_http,
    put_stdio,
)
from tests.support.polling import wait_for
from tests.support.processes import HttpServer, free_port, running
from tests.support.requests import publish
from tests.support.sidecar import RunningSidecar, Stubs, on_loop

SMALL = ["--tools", "3"]

# One listener and one database are enough: these tests are about MCP, not the gRPC transport
# or storage.
SIDECAR_TRANSPORTS = ["unix"]
SIDECAR_DATABASES = ["sqlite"]

# The sweep's bound is far away, so that only a listing's own ttlMs can bring a re-listing
# within a test; its floor is short, so that one does quickly.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": fixture_commands(),
    "mcp_reconnect_min_seconds": 0.1,
    "mcp_reconnect_max_seconds": 0.5,
    "catalog_ttl_seconds": 3600.0,
    "mcp_min_list_ttl_seconds": 0.2,
}


def _timings(catalog_ttl: float, floor: float) -> SessionTimings:
    return SessionTimings(
        connect_timeout=1.0,
        reconnect_min=0.1,
        reconnect_max=1.0,
        list_changed_debounce=0.1,
        catalog_ttl=catalog_ttl,
        min_list_ttl=floor,
    )


@pytest.mark.parametrize(
    ("ttl", "expected"),
    [
        (None, math.inf),  # the server said nothing: the sweep's bound alone
        (0.0, 10.0),  # "stale at once" is the floor, no busy loop
        (30.0, 30.0),
        (300.0, math.inf),  # no sooner than the sweep: the sweep's bound
        (10_000.0, math.inf),  # a longer ttl never delays the sweep
    ],
)
def test_a_listings_ttl_brings_the_next_listing_forward_within_the_sweeps_bound(
    ttl: float | None, expected: float
) -> None:
    assert stale_after(ttl, _timings(300.0, 10.0)) == expected


def test_a_short_ttl_ms_re_lists_a_change_nobody_announced(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    put_stdio(stubs, tenant, "short", args=[*SMALL, "--list-ttl-ms", "300"])
    runner = grpc_server.sidecar.tool_runner
    add = McpToolRequest(
        tenant=tenant,
        server="short",
        tool="add_tool",
        arguments={"name": "unannounced", "notify": False},
    )
    on_loop(grpc_server, runner.call_tool(add, 20))
    # Neither list_changed nor the sweep (an hour away): the listing's ttlMs.
    wait_for(lambda: "unannounced" in catalog_names(stubs, tenant, "short"), "the ttlMs re-listing")


def _run(stubs: Stubs, tenant: str, unique: Callable[[str], str]) -> str:
    spec = unique("spec")
    publish(stubs, spec, grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
    request = run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec, spec_version=1)
    return stubs.runs.CreateRun(request).run.run_id


def _call(
    stubs: Stubs, run_id: str, server: str, tool: str, call_id: str, **arguments: Any
) -> tuple[bool, str]:
    struct = struct_pb2.Struct()
    struct.update(arguments)
    request = tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id, server=server, tool=tool, arguments=struct, call_id=call_id
    )
    outcome = stubs.tools.CallDeferredTool(request, timeout=30).outcome
    content = json.loads(outcome.result_json)["content"]
    return outcome.is_error, "".join(part.get("text", "") for part in content)


def test_standard_headers_reach_a_server_that_refuses_their_absence(
    stubs: Stubs, tenant: str, unique: Callable[[str], str]
) -> None:
    port = free_port()
    argv = [sys.executable, str(FIXTURE_SERVER), "http", "--port", str(port), *SMALL]
    server = HttpServer([*argv, "--client-duty-tools", "--require-standard-headers"], port)
    url = f"http://127.0.0.1:{port}/mcp"
    with running(server):
        # The server does refuse a 2026-07-28 request without them.
        bare = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/list",
            "params": {
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            },
        }
        request = urllib.request.Request(
            url,
            data=json.dumps(bare).encode(),
            headers={
                "content-type": "application/json",
                "accept": "application/json, text/event-stream",
                "mcp-protocol-version": "2026-07-28",
            },
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 400
        assert json.loads(refused.value.read())["error"]["code"] == -32020
        # The sidecar lists (tools/list, server/discover, subscriptions/listen) and calls.
        put_http(stubs, tenant, "strict", url)
        assert ODD_NAME_TOOL.name in catalog_names(stubs, tenant, "strict")
        run_id = _run(stubs, tenant, unique)
        # A name outside the naming rules: catalogued, and its Mcp-Name sent Base64-encoded.
        assert _call(stubs, run_id, "strict", ODD_NAME_TOOL.name, "c1") == (
            False,
            f"{ODD_NAME_TOOL.name} ran",
        )
        assert _call(stubs, run_id, "strict", "echo", "c2", text="hi") == (False, "hi")


def test_a_null_argument_is_the_servers_to_judge(
    stubs: Stubs, tenant: str, unique: Callable[[str], str]
) -> None:
    port = free_port()
    argv = [sys.executable, str(FIXTURE_SERVER), "http", "--port", str(port), *SMALL]
    with running(HttpServer([*argv, "--client-duty-tools"], port)):
        put_http(stubs, tenant, "nulls", f"http://127.0.0.1:{port}/mcp")
        run_id = _run(stubs, tenant, unique)
        # Sent as given (no Mcp-Param-Verbose header for it), and the server answered.
        is_error, text = _call(stubs, run_id, "nulls", "optional_flag", "c1", verbose=None)
        assert "nothing was run" not in text
        assert (is_error, json.loads(text)) == (False, {"verbose": None})
        # What is surely wrong is still refused before anything runs.
        is_error, text = _call(stubs, run_id, "nulls", "optional_flag", "c2", verbose="yes")
        assert is_error
        assert "nothing was run" in text

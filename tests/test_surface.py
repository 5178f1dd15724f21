"""The tool surface on plain data: tiers, exposed tools, server lines, determinism."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from psych_sidecar.domain.catalog import (
    CatalogTool,
    Connection,
    ConnectionState,
    ConnectionStatus,
    TransportKind,
)
from psych_sidecar.domain.runlog import DisclosureSettings
from psych_sidecar.domain.surface import (
    DisclosureLimits,
    DisclosureTier,
    ExposedKind,
    VisibleServer,
    naming,
    resolve_surface,
    status_note,
    tier_for,
)

LIMITS = DisclosureLimits()
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def server(
    name: str,
    count: int,
    state: ConnectionState = ConnectionState.CONNECTED,
    schema: bytes = b'{"type":"object","properties":{"b":{"type":"string"},"a":{}}}',
    **fields: object,
) -> VisibleServer:
    connection = Connection(tenant="t", name=name, transport=TransportKind.STDIO, **fields)  # type: ignore[arg-type]
    tools = tuple(
        CatalogTool(name, f"tool_{i:03d}", f"Does thing {i}.\nMore detail.", schema)
        for i in range(count)
    )
    return VisibleServer(connection, ConnectionStatus(state, "", EPOCH, 1), tools)


def test_defaults_are_documented_values() -> None:
    assert DisclosureLimits.of(DisclosureSettings()) == DisclosureLimits(16, 24, 200)
    assert DisclosureLimits.of(DisclosureSettings(direct_max_tools=5)).direct_max_tools == 5


@pytest.mark.parametrize(
    ("preload", "count", "tier"),
    [
        (None, 16, DisclosureTier.DIRECT),
        (None, 17, DisclosureTier.DEFERRED),
        (False, 1, DisclosureTier.DEFERRED),
        (True, 24, DisclosureTier.DIRECT),
        (True, 25, DisclosureTier.FACADE),
        (True, 200, DisclosureTier.FACADE),
        (True, 201, DisclosureTier.SEARCH),
        (True, 0, DisclosureTier.DIRECT),
    ],
)
def test_tier_follows_preload_and_permitted_count(
    preload: bool | None, count: int, tier: DisclosureTier
) -> None:
    visible = server("s", count, preload=preload)
    assert tier_for(visible.connection, count, LIMITS) is tier


def test_spec_thresholds_move_the_tiers() -> None:
    limits = DisclosureLimits(auto_preload_max_tools=2, direct_max_tools=1, facade_max_tools=3)
    connection = server("s", 0).connection
    assert tier_for(connection, 2, limits) is DisclosureTier.FACADE
    assert tier_for(connection, 3, DisclosureLimits(5, 1, 2)) is DisclosureTier.SEARCH
    assert tier_for(connection, 3, limits) is DisclosureTier.DEFERRED


def test_direct_tier_copies_each_tool_with_canonical_schema() -> None:
    surface = resolve_surface([server("gh", 3)], LIMITS)
    direct = [t for t in surface.tools if t.kind is ExposedKind.MCP_TOOL]
    assert [t.name for t in direct] == ["gh__tool_000", "gh__tool_001", "gh__tool_002"]
    assert direct[0].input_schema_json == (
        b'{"properties":{"a":{},"b":{"type":"string"}},"type":"object"}'
    )
    assert (direct[0].server, direct[0].tool) == ("gh", "tool_000")
    assert surface.servers[0].tier is DisclosureTier.DIRECT


def test_deferred_server_has_a_line_and_meta_tools_but_no_schemas() -> None:
    surface = resolve_surface([server("big", 300, description="Issue tracker " * 40)], LIMITS)
    assert [t.name for t in surface.tools] == [
        naming.CALL_TOOL,
        naming.DESCRIBE_TOOL,
        naming.LIST_TOOLS,
    ]
    (line,) = surface.servers
    assert line.tier is DisclosureTier.DEFERRED
    assert line.permitted_tool_count == 300
    assert "big (deferred, 300 tools)" in line.text
    assert naming.LIST_TOOLS in line.text
    assert "\n" not in line.text
    # The description is capped at 200 characters (199 and an ellipsis).
    description = line.text.split(": ", 1)[1].split("… ", 1)[0] + "…"
    assert description == ("Issue tracker " * 15)[:199] + "…"


def test_deferred_server_with_eager_tools_stays_deferred() -> None:
    visible = server("s", 40, eager_tools=("tool_003", "tool_039", "not_permitted"))
    surface = resolve_surface([visible], LIMITS)
    assert surface.servers[0].tier is DisclosureTier.DEFERRED
    direct = [t.name for t in surface.tools if t.kind is ExposedKind.MCP_TOOL]
    assert direct == ["s__tool_003", "s__tool_039"]
    assert "Offered directly as well: tool_003, tool_039." in surface.servers[0].text


def test_facade_indexes_every_permitted_tool() -> None:
    surface = resolve_surface([server("mid", 30, preload=True)], LIMITS)
    (facade,) = [t for t in surface.tools if t.kind is ExposedKind.FACADE]
    assert facade.name == "mid"
    lines = facade.description.splitlines()
    assert lines[0].startswith("Call one of the 30 tools of MCP server mid")
    assert lines[1:-1] == [f"- tool_{i:03d}: Does thing {i}." for i in range(30)]
    # Its last line: arguments may pass stored results by reference (on unless the Spec
    # turns it off).
    assert lines[-1] == naming.REFERENCE_GUIDANCE
    schema = json.loads(facade.input_schema_json)
    assert schema["properties"]["tool"]["enum"] == [f"tool_{i:03d}" for i in range(30)]
    assert schema["required"] == ["tool"]


def test_search_tier_exposes_the_search_pair_once() -> None:
    surface = resolve_surface(
        [server("a", 300, preload=True), server("b", 201, preload=True)], LIMITS
    )
    kinds = sorted(t.kind.value for t in surface.tools)
    assert kinds == sorted(
        [
            "search",
            "call_by_name",
            "list_deferred_tools",
            "describe_deferred_tool",
            "call_deferred_tool",
        ]
    )
    assert all(line.tier is DisclosureTier.SEARCH for line in surface.servers)


def test_unreachable_server_keeps_its_tools_and_says_so() -> None:
    surface = resolve_surface([server("down", 2, ConnectionState.UNREACHABLE)], LIMITS)
    assert [t.name for t in surface.tools if t.kind is ExposedKind.MCP_TOOL] == [
        "down__tool_000",
        "down__tool_001",
    ]
    assert surface.servers[0].state is ConnectionState.UNREACHABLE
    # The roster line has no state (it sits in zone 2); the transient message says it.
    assert "UNREACHABLE" not in surface.servers[0].text
    assert status_note(surface.servers, {}) == (
        "Tool server status: down is UNREACHABLE: its calls fail until it reconnects."
    )
    assert status_note(surface.servers, {"down": ConnectionState.CONNECTED}) == ""


def test_no_servers_no_tools() -> None:
    surface = resolve_surface([], LIMITS)
    assert surface.tools == ()
    assert surface.servers == ()


def test_surface_is_deterministic_and_sorted() -> None:
    servers = [server("zeta", 3), server("alpha", 30, preload=True), server("mid", 100)]
    first = resolve_surface(servers, LIMITS)
    again = resolve_surface(list(reversed(servers)), LIMITS)
    assert first == again
    assert [t.name for t in first.tools] == sorted(t.name for t in first.tools)
    assert [line.server for line in first.servers] == ["alpha", "mid", "zeta"]


def test_non_object_or_broken_schemas_become_object_schemas() -> None:
    for raw in (b"", b"not json", b"[1]", b'{"properties":{}}'):
        surface = resolve_surface([server("s", 1, schema=raw)], LIMITS)
        (tool,) = [t for t in surface.tools if t.kind is ExposedKind.MCP_TOOL]
        assert json.loads(tool.input_schema_json)["type"] == "object"

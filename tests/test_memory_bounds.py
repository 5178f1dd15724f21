"""Memory bounded by bytes: caches weigh their values, search indexes are shared across Runs and
turns that reach the same tools of the same catalogue versions, and the least recently used go
first when the budget is spent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    run_service_pb2,
    spec_pb2,
    tool_service_pb2,
)
from psych_sidecar.domain.cache import ByteBudgetCache
from tests.support.connections import fixture_commands
from tests.support.polling import wait_for
from tests.support.requests import publish
from tests.support.sidecar import RunningSidecar, Stubs


def test_a_byte_budget_keeps_the_most_recent_values_that_fit() -> None:
    cache = ByteBudgetCache[str, bytes](100, len)
    cache.put("a", b"x" * 40)
    cache.put("b", b"x" * 40)
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", b"x" * 40)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (b"x" * 40, None, b"x" * 40)
    assert cache.bytes == 80
    cache.put("huge", b"x" * 101)
    assert cache.get("huge") is None
    assert cache.bytes == 80
    cache.put("a", b"x" * 10)
    assert cache.bytes == 50
    assert len(cache) == 2


def test_a_byte_budget_forgets_what_it_is_told_to_and_its_bytes() -> None:
    # The reader's parsed results go this way when no query used them for a while.
    cache = ByteBudgetCache[str, bytes](100, len)
    for key, size in (("a", 10), ("b", 20), ("c", 30)):
        cache.put(key, b"x" * size)
    assert cache.discard_where(lambda value: len(value) >= 20) == 2
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (b"x" * 10, None, None)
    assert (cache.bytes, len(cache)) == (10, 1)
    cache.put("d", b"x" * 90)
    assert cache.get("a") is not None


# Loopback TCP.
SIDECAR_TRANSPORTS = ["tcp"]


# The fixture MCP server; keyword search (the memory question is the same with vectors).
SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": fixture_commands(),
    "semantic_search": "off",
}


def test_runs_of_different_specs_with_the_same_reach_share_one_search_index(
    grpc_server: RunningSidecar, stubs: Stubs, unique: Callable[[str], str]
) -> None:
    tenant = unique("tenant")
    connection = connection_pb2.Connection(
        tenant=tenant, name="fx", stdio=connection_pb2.StdioTransport(command="fixture")
    )
    stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    )
    wait_for(
        lambda: (
            stubs.connections.ListConnections(
                connection_service_pb2.ListConnectionsRequest(tenant=tenant)
            )
            .connections[0]
            .catalog_version
        ),
        "the first listing",
    )
    resolver = grpc_server.sidecar.resolver
    count_before, bytes_before = resolver.search_indexes
    runs = []
    for _ in range(3):
        spec = unique("spec")
        publish(stubs, spec, grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
        runs.append(
            stubs.runs.CreateRun(
                run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec, spec_version=1)
            ).run.run_id
        )
    for run_id in runs:
        hits = stubs.tools.SearchTools(
            tool_service_pb2.SearchToolsRequest(run_id=run_id, query="generated tool 7")
        ).hits
        assert hits
    count_after, bytes_after = resolver.search_indexes
    assert count_after == count_before + 1
    assert bytes_after > bytes_before

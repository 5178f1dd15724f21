"""The stale-catalogue race, forced: a storage thread that read an older catalogue version and
finishes late must not make another thread, which read the newer version, get the older
version's tools (the resolver would then cache them under the newer version)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from psych.sidecar.v1 import run_service_pb2, spec_pb2, spec_service_pb2
from psych_sidecar.domain.catalog import McpToolRequest
from psych_sidecar.mcp.catalog_view import SessionCatalogView
from tests.support.connections import fixture_commands, put_stdio
from tests.support.polling import wait_for
from tests.support.sidecar import RunningSidecar, Stubs, on_loop

# Loopback TCP: the race is in the MCP layer's caches.
SIDECAR_TRANSPORTS = ["tcp"]


# The fixture MCP server over stdio.
SIDECAR_OVERRIDES: dict[str, Any] = {"mcp_commands": fixture_commands()}


def _listed_once(
    grpc_server: RunningSidecar, stubs: Stubs, unique: Callable[[str], str]
) -> tuple[SessionCatalogView, str]:
    """The sidecar's catalogue view and a new tenant whose connection `fx` is at version 1."""
    view = grpc_server.sidecar.catalog
    tenant = unique("tenant")
    put_stdio(stubs, tenant, "fx", args=["--tools", "0"])
    wait_for(
        lambda: view._store.connection_versions(tenant).get("fx", (0, 0))[1] == 1,
        "catalogue version 1",
    )
    return view, tenant


def test_a_late_stale_read_does_not_serve_an_older_catalogue(
    grpc_server: RunningSidecar,
    stubs: Stubs,
    unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view, tenant = _listed_once(grpc_server, stubs, unique)
    store = view._store

    def stored_version() -> int:
        return int(store.connection_versions(tenant).get("fx", (0, 0))[1])

    ((_, status),) = view.tenant_connections(tenant)
    assert status.catalog_version == 1
    assert "late_tool" not in {t.name for t in view.current_tools(tenant, "fx", 1)}

    # Thread B reads the versions (1) and is held before it finishes.
    original = store.connection_versions
    stale: dict[str, threading.Thread] = {}
    read, release = threading.Event(), threading.Event()

    def held(asked: str) -> Any:
        versions = original(asked)
        if threading.current_thread() is stale.get("thread"):
            read.set()
            release.wait(30)
        return versions

    monkeypatch.setattr(store, "connection_versions", held)
    stale["thread"] = threading.Thread(target=lambda: view.tenant_connections(tenant))
    stale["thread"].start()
    assert read.wait(30)

    # The catalogue moves on: a tool added at runtime, announced, re-listed as version 2.
    runner = grpc_server.sidecar.tool_runner
    add = McpToolRequest(
        tenant=tenant, server="fx", tool="add_tool", arguments={"name": "late_tool"}
    )
    on_loop(grpc_server, runner.call_tool(add, 10))
    wait_for(lambda: stored_version() == 2, "catalogue version 2")

    # Thread A (this one) reads version 2; then B's stale read of version 1 completes.
    ((_, status),) = view.tenant_connections(tenant)
    assert status.catalog_version == 2
    release.set()
    stale["thread"].join(30)

    tools = view.current_tools(tenant, "fx", status.catalog_version)
    assert "late_tool" in {tool.name for tool in tools}


def test_a_version_superseded_between_its_two_reads_still_permits_its_tools(
    grpc_server: RunningSidecar,
    stubs: Stubs,
    unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A resolution reads the connection's version, then that version's tools. When another
    # sidecar writes a newer version in between, the rows read carry its removal marker; the
    # Run must still reach them (it once found no tool at all, in the scale-out CI).
    view, tenant = _listed_once(grpc_server, stubs, unique)
    store = view._store
    grants = [spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")]
    spec = spec_pb2.Spec(name=unique("spec"), version=1, grants=grants)
    stubs.specs.PublishSpec(spec_service_pb2.PublishSpecRequest(spec=spec))
    run_id = stubs.runs.CreateRun(
        run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec.name, spec_version=1)
    ).run.run_id

    original = store.catalog_tools
    stored = store.get_connection(tenant, "fx")
    assert stored is not None

    def superseded_first(asked_tenant: str, server: str, version: int) -> Any:
        if asked_tenant == tenant and version == 1:
            # Version 2 lands after the connection row (version 1) was read.
            store.write_catalog(tenant, "fx", stored.revision, [])
        return original(asked_tenant, server, version)

    monkeypatch.setattr(store, "catalog_tools", superseded_first)
    _, resolved = grpc_server.sidecar.resolver.resolved(run_id)
    assert resolved.snapshot.servers["fx"].status.catalog_version == 1
    assert all(tool.removed_in_version == 2 for tool in resolved.snapshot.servers["fx"].tools)
    assert "add_tool" in resolved.permitted["fx"]

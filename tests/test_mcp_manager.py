"""The MCP session registry owns every task it starts: after stop() nothing starts, and a deleted
connection leaves nothing behind. Against a real sidecar on a real SQLite file and the
project's fixture MCP server."""

from __future__ import annotations

import asyncio
from pathlib import Path

from psych_sidecar.config import Settings
from psych_sidecar.domain.catalog import Connection, ConnectionState, TransportKind
from tests.support.connections import fixture_commands
from tests.support.polling import wait_for
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar, on_loop


def _settings(tmp_path: Path) -> Settings:
    return flat_settings(
        listen=[f"unix://{tmp_path / 's.sock'}"],
        database_url=f"sqlite:///{tmp_path / 'sidecar.db'}",
        data_dir=tmp_path,
        mcp_commands=fixture_commands(),
        shutdown_grace_seconds=2,
    )


def _fixture(tenant: str, name: str) -> Connection:
    return Connection(tenant=tenant, name=name, transport=TransportKind.STDIO, command="fixture")


def _session_tasks(running: RunningSidecar) -> list[str]:
    """The registry's tasks, read on the sidecar's loop. That loop runs callbacks in the order
    they were scheduled: whatever another thread scheduled before this call has run."""

    async def names() -> list[str]:
        return sorted(
            task.get_name() for task in asyncio.all_tasks() if task.get_name().startswith("mcp-")
        )

    return on_loop(running, names())


def test_nothing_starts_after_stop(tmp_path: Path) -> None:
    with RunningSidecar(_settings(tmp_path)) as running:
        sidecar = running.sidecar
        # Another sidecar on the same database stores a connection; this one notices it when
        # a storage thread lists the tenant's connections, and starts its session.
        sidecar.graph.connection_store.put_connection(_fixture("acme", "early"))
        sidecar.catalog.tenant_connections("acme")
        wait_for(
            lambda: "mcp-session early" in _session_tasks(running),
            "the session of a connection another sidecar stored",
        )
        on_loop(running, sidecar.mcp.stop())
        assert _session_tasks(running) == []
        # After stop the same notice starts nothing: listed as not running here yet (the
        # state that would have started its session), and no task.
        sidecar.graph.connection_store.put_connection(_fixture("acme", "late"))
        listed = sidecar.catalog.tenant_connections("acme")
        assert [(connection.name, status.state) for connection, status in listed] == [
            ("early", ConnectionState.CONNECTING),
            ("late", ConnectionState.CONNECTING),
        ]
        assert _session_tasks(running) == []


def test_stop_ends_every_task_it_started(tmp_path: Path) -> None:
    with RunningSidecar(_settings(tmp_path)) as running:
        sidecar = running.sidecar
        on_loop(running, sidecar.graph.supervisor.put_connection(_fixture("acme", "first")))
        assert _session_tasks(running) == ["mcp-catalog-sweep", "mcp-session first"]
        on_loop(running, sidecar.mcp.stop())
        assert _session_tasks(running) == []


def test_a_deleted_connection_leaves_no_lock_behind(tmp_path: Path) -> None:
    with RunningSidecar(_settings(tmp_path)) as running:
        supervisor = running.sidecar.graph.supervisor
        for index in range(5):
            on_loop(running, supervisor.put_connection(_fixture("acme", f"c{index}")))
            on_loop(running, supervisor.delete_connection("acme", f"c{index}"))
        # Per-name locks exist only for live connections: the map does not grow with every
        # name ever used.
        assert running.sidecar.mcp._key_locks == {}

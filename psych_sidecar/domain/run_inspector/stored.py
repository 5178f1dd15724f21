"""Reading a database with no live MCP sessions (``psych-sidecar inspect --database-url``).

:class:`StoredCatalog` is the CatalogView and ConnectionSupervisor of a reader that runs no
sessions: connections and catalogues exactly as stored, every connection in the state a
sidecar reports for one it is not running (CONNECTING since its last change), and nothing it
can put, delete or refresh. :class:`PinnedStates` hands assembly the stored surface of the
turn and no live states, so the prompt's status note is the one pinned with that surface.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from psych_sidecar.domain.catalog import (
    CatalogTool,
    CatalogWrite,
    Connection,
    ConnectionRepository,
    ConnectionState,
    ConnectionStatus,
    StoredConnection,
    without_secrets,
)
from psych_sidecar.domain.errors import NotImplementedHere
from psych_sidecar.domain.surface import ToolSurface, TurnResolver


def _read_only(method: str) -> NotImplementedHere:
    return NotImplementedHere(
        f"{method}: this reader only reads: it runs no MCP sessions and writes nothing",
        method=method,
    )


class StoredCatalog:
    def __init__(self, store: ConnectionRepository) -> None:
        self._store = store

    # ConnectionSupervisor

    def status(self, stored: StoredConnection) -> ConnectionStatus:
        """What the database holds: the newest catalogue version and when the connection was
        last put; no live state (no session runs here)."""
        return ConnectionStatus(
            ConnectionState.CONNECTING,
            "",
            stored.update_time,
            stored.catalog_version,
            rejected=stored.rejected,
        )

    async def put_connection(self, connection: Connection) -> tuple[Connection, ConnectionStatus]:
        raise _read_only("put_connection")

    async def delete_connection(self, tenant: str, name: str) -> None:
        raise _read_only("delete_connection")

    async def refresh_catalog(self, tenant: str, name: str) -> CatalogWrite:
        raise _read_only("refresh_catalog")

    async def begin_sign_in(self, tenant: str, name: str) -> tuple[str, str, datetime]:
        raise _read_only("begin_sign_in")

    async def complete_sign_in(
        self, tenant: str, state: str, code: str, name: str, *, iss: str | None
    ) -> tuple[Connection, ConnectionStatus]:
        raise _read_only("complete_sign_in")

    # CatalogView

    def tenant_connections(self, tenant: str) -> list[tuple[Connection, ConnectionStatus]]:
        listed = []
        for name in sorted(self._store.connection_versions(tenant)):
            stored = self._store.get_connection(tenant, name)
            if stored is not None:
                listed.append((without_secrets(stored.connection), self.status(stored)))
        return listed

    def tenant_connections_now(
        self, tenant: str, versions: dict[str, tuple[int, int]]
    ) -> list[tuple[Connection, ConnectionStatus]] | None:
        return None  # a reader keeps nothing in memory: every read is the storage's

    def current_tools(self, tenant: str, server: str, version: int = 0) -> list[CatalogTool]:
        read = self._store.catalog_tools(tenant, server, version)
        return [] if read is None else read[1]


class PinnedStates:
    """The TurnSurfaces of a reader without sessions: the turn's surface from the resolver
    (which reads the stored pin) and no live states, so the status note says each server's
    state as pinned with the surface."""

    def __init__(self, resolver: TurnResolver) -> None:
        self._resolver = resolver

    def resolve_turn(self, run_id: str) -> ToolSurface:
        return self._resolver.resolve_turn(run_id)

    def server_states(self, run_id: str) -> Mapping[str, ConnectionState]:
        return {}

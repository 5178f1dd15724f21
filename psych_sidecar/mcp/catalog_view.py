"""The CatalogView of domain/catalog: connections and their current tools as a turn resolves
them, read on storage threads from the database and two caches, with each connection's state
from the session registry."""

from __future__ import annotations

import dataclasses

from psych_sidecar.domain.catalog import (
    CatalogTool,
    Connection,
    ConnectionState,
    ConnectionStatus,
    StoredConnection,
    without_secrets,
)
from psych_sidecar.mcp.registry import Key, SessionRegistry


class SessionCatalogView:
    """Implements CatalogView. Synchronous: its methods run on storage threads; they read the
    database and the caches, and ask the registry to start sessions for connections another
    sidecar stored."""

    def __init__(self, sessions: SessionRegistry) -> None:
        self._sessions = sessions
        self._store = sessions.store
        # Filled on storage threads. Entries are replaced whole.
        self._public: dict[Key, StoredConnection] = {}
        self._tools: dict[Key, tuple[int, tuple[CatalogTool, ...]]] = {}
        sessions.on_forget(self._forget)

    def tenant_connections(self, tenant: str) -> list[tuple[Connection, ConnectionStatus]]:
        versions = self._store.connection_versions(tenant)
        read: dict[str, StoredConnection] = {}
        for name in self._not_in_memory(tenant, versions):
            stored = self._store.get_connection(tenant, name)
            if stored is not None:  # deleted since the versions were read: not listed
                public = dataclasses.replace(stored, connection=without_secrets(stored.connection))
                read[name] = self._public[(tenant, name)] = public
        return self._listed(tenant, versions, read)

    def tenant_connections_now(
        self, tenant: str, versions: dict[str, tuple[int, int]]
    ) -> list[tuple[Connection, ConnectionStatus]] | None:
        """`tenant_connections` at the versions just read, on the event loop: from memory alone,
        None when a connection is not there at its revision."""
        if self._not_in_memory(tenant, versions):
            return None
        return self._listed(tenant, versions, {})

    def _not_in_memory(self, tenant: str, versions: dict[str, tuple[int, int]]) -> list[str]:
        return [
            name
            for name, (revision, _) in versions.items()
            if self._public_at((tenant, name), revision) is None
        ]

    def _listed(
        self,
        tenant: str,
        versions: dict[str, tuple[int, int]],
        read: dict[str, StoredConnection],
    ) -> list[tuple[Connection, ConnectionStatus]]:
        """The connections of `versions` in name order, each as kept in memory at its revision
        or as just `read`, with its state."""
        listed: list[tuple[Connection, ConnectionStatus]] = []
        for name in sorted(versions):
            revision, catalog_version = versions[name]
            key = (tenant, name)
            cached = self._public_at(key, revision) or read.get(name)
            if cached is not None:
                listed.append(self._with_status(key, cached, catalog_version))
        return listed

    def _public_at(self, key: Key, revision: int) -> StoredConnection | None:
        """The connection without its secrets, as kept in memory at this revision."""
        cached = self._public.get(key)
        return cached if cached is not None and cached.revision == revision else None

    def _with_status(
        self, key: Key, cached: StoredConnection, catalog_version: int
    ) -> tuple[Connection, ConnectionStatus]:
        revision = cached.revision
        status = self._sessions.status_of(key, revision, catalog_version, cached.update_time)
        if status.state is ConnectionState.CONNECTING and self._sessions.session_lags(
            key, revision
        ):
            # Stored or replaced by another sidecar: have this one catch up.
            self._sessions.reconcile_soon(key)
        return cached.connection, status

    def current_tools(self, tenant: str, server: str, version: int = 0) -> list[CatalogTool]:
        """The tools of catalogue `version` (0: the newest). The caller names the version it
        read with the connection, so the tools always belong to it: no shared "last seen
        version" that another storage thread could overwrite with an older read meanwhile."""
        key = (tenant, server)
        cached = self._tools.get(key)
        if cached is not None and version and cached[0] == version:
            return list(cached[1])
        read = self._store.catalog_tools(tenant, server, version)
        if read is None:
            return []
        read_version, tools = read
        # Only ever replaced by a newer version: an older read landing late does not evict it.
        if cached is None or read_version >= cached[0]:
            self._tools[key] = (read_version, tuple(tools))
        return tools

    def _forget(self, key: Key) -> None:
        self._public.pop(key, None)
        self._tools.pop(key, None)

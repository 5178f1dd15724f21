"""The ConnectionSupervisor of domain/catalog: putting, deleting and refreshing a connection go
through the session registry, which owns the sessions; sign-in goes to `sign_in.py`."""

from __future__ import annotations

from datetime import datetime

from psych_sidecar.domain.catalog import (
    CatalogWrite,
    Connection,
    ConnectionState,
    ConnectionStatus,
    StoredConnection,
    connection_authorization_required,
    connection_not_found,
    validate_connection,
)
from psych_sidecar.domain.errors import ConnectionUnreachable
from psych_sidecar.mcp.registry import SessionRegistry, describe
from psych_sidecar.mcp.session_types import CatalogUnavailable
from psych_sidecar.mcp.sign_in import OAuthSignIn


class SessionSupervisor:
    """Implements ConnectionSupervisor over `sessions`; sign-in is `sign_in`'s. Runs on the
    server's event loop."""

    def __init__(self, sessions: SessionRegistry, sign_in: OAuthSignIn) -> None:
        self._sessions = sessions
        self._sign_in = sign_in

    async def put_connection(self, connection: Connection) -> tuple[Connection, ConnectionStatus]:
        """Store, connect, list right away; return the state after the first attempt."""
        sessions = self._sessions
        validate_connection(connection, sessions.allowed_commands)
        async with sessions.lock((connection.tenant, connection.name)):
            stored: StoredConnection = await sessions.blocking(
                sessions.store.put_connection, connection
            )
            session = await sessions.replace_session(stored)
        await sessions.first_attempt(session)
        return await sessions.describe(connection.tenant, connection.name)

    async def delete_connection(self, tenant: str, name: str) -> None:
        sessions = self._sessions
        key = (tenant, name)
        async with sessions.lock(key):
            if not await sessions.blocking(sessions.store.delete_connection, tenant, name):
                raise connection_not_found(tenant, name)
            await sessions.stop_session(key)
            sessions.forget(key)
        sessions.drop_lock(key)

    def status(self, stored: StoredConnection) -> ConnectionStatus:
        return self._sessions.status(stored)

    async def refresh_catalog(self, tenant: str, name: str) -> CatalogWrite:
        """Re-list now. An unreachable server is retried at once; a failure removes nothing."""
        session = await self._sessions.session(tenant, name)
        if session is None:
            raise connection_not_found(tenant, name)
        state = session.state
        if state.status.state is not ConnectionState.CONNECTED:
            finished = state.finished_attempts
            session.reconnect_now()
            await state.wait_attempt(finished, self._sessions.timings.connect_timeout + 1)
        if state.status.authorization_reason is not None:
            raise connection_authorization_required(name, state.status.authorization_reason)
        try:
            return await session.catalog.refresh("on_demand")
        except CatalogUnavailable as error:
            detail = describe(error)
            raise ConnectionUnreachable(
                f"could not refresh the catalogue of {name!r}: {detail}; nothing was removed",
                connection=name,
                detail=detail,
            ) from None

    async def begin_sign_in(self, tenant: str, name: str) -> tuple[str, str, datetime]:
        return await self._sign_in.begin(tenant, name)

    async def complete_sign_in(
        self, tenant: str, state: str, code: str, name: str, *, iss: str | None
    ) -> tuple[Connection, ConnectionStatus]:
        return await self._sign_in.complete(tenant, state, code, name, iss=iss)

"""OAuth sign-in to a connection (authorization code with PKCE): begin hands out the
authorization URL and a state; complete spends the state, checks the response's issuer
(RFC 9207), exchanges the code, stores the grant and restarts the connection's session with
it. A client's credentials go to the authorization server they are bound to only (issuers)."""

from __future__ import annotations

from datetime import UTC, datetime

from psych_sidecar.domain.catalog import (
    AuthKind,
    Connection,
    ConnectionStatus,
    PendingSignIn,
    StoredConnection,
    connection_not_found,
    sign_in_not_applicable,
)
from psych_sidecar.domain.errors import (
    OAuthGrantRefused,
    SignInStateExpired,
    SignInStateMismatch,
    SignInStateUnknown,
    SignInStateUsed,
    SignInStateWrongTenant,
    short,
)
from psych_sidecar.mcp.registry import SessionRegistry


class OAuthSignIn:
    """Sign-in over `sessions` (its OAuth flows, storage and sessions). Runs on the server's
    event loop; the OAuth modules are imported at the first sign-in."""

    def __init__(self, sessions: SessionRegistry) -> None:
        self._sessions = sessions

    async def begin(self, tenant: str, name: str) -> tuple[str, str, datetime]:
        from psych_sidecar.mcp.oauth.flows import step_up_scope
        from psych_sidecar.mcp.oauth.issuers import grant_issuer

        sessions = self._sessions
        flows, grants = sessions.oauth_flows()
        stored: StoredConnection | None = await sessions.blocking(
            sessions.store.get_connection, tenant, name
        )
        if stored is None:
            raise connection_not_found(tenant, name)
        auth = stored.connection.auth
        if auth is None or auth.kind is not AuthKind.AUTHORIZATION_CODE:
            raise sign_in_not_applicable(name, auth.kind if auth is not None else None)
        grant = await sessions.blocking(grants.get_grant, tenant, name)
        url, state, pending = await flows.begin(
            stored,
            grant.client_json if grant is not None else None,
            step_up_scope(grant),
            granted_by=grant_issuer(grant),
        )
        await sessions.blocking(grants.save_sign_in, pending)
        return url, state, pending.expire_time

    async def complete(
        self, tenant: str, state: str, code: str, name: str, *, iss: str | None
    ) -> tuple[Connection, ConnectionStatus]:
        from psych_sidecar.mcp.oauth.flows import TokenRefused, state_digest
        from psych_sidecar.mcp.oauth.issuers import grant_issuer

        sessions = self._sessions
        flows, grants = sessions.oauth_flows()
        now = datetime.now(UTC)

        def check(pending: PendingSignIn, revision: int | None) -> None:
            # The tenant first: another tenant learns nothing of the sign-in, not even
            # whether it was used or expired, and spends nothing.
            if pending.tenant != tenant:
                raise SignInStateWrongTenant(
                    f"the state was not issued to tenant {short(tenant)!r}",
                    tenant=short(tenant),
                )
            if pending.used_time is not None:
                raise SignInStateUsed(
                    f"the state of this sign-in to {pending.name!r} was already used; begin again",
                    tenant=short(tenant),
                    connection=pending.name,
                )
            if pending.expire_time <= now:
                expired = pending.expire_time.strftime("%Y-%m-%dT%H:%M:%SZ")
                raise SignInStateExpired(
                    f"the sign-in to {pending.name!r} expired at {expired}; begin again",
                    tenant=short(tenant),
                    connection=pending.name,
                    expire_time=expired,
                )
            detail = ""
            if name and name != pending.name:
                detail = (
                    f"the state was issued for connection {pending.name!r}, not {short(name)!r}"
                )
            elif revision is None:
                detail = f"connection {pending.name!r} was deleted since the sign-in began"
            elif revision != pending.revision:
                detail = f"connection {pending.name!r} was replaced since the sign-in began"
            if detail:
                raise SignInStateMismatch(
                    detail,
                    tenant=short(tenant),
                    connection=pending.name,
                    detail=detail,
                )

        pending: PendingSignIn | None = await sessions.blocking(
            grants.spend_sign_in, state_digest(state), check
        )
        if pending is None:
            raise SignInStateUnknown(
                "no sign-in with this state: it was never begun, or was removed long after it "
                "expired",
                tenant=short(tenant),
            )
        key = (tenant, pending.name)
        stored: StoredConnection | None = await sessions.blocking(
            sessions.store.get_connection, *key
        )
        if stored is None or stored.revision != pending.revision:
            raise SignInStateMismatch(
                f"connection {pending.name!r} changed during the sign-in",
                tenant=short(tenant),
                connection=pending.name,
                detail="the connection changed during the sign-in",
            )
        current = await sessions.blocking(grants.get_grant, *key)
        try:
            grant = await flows.complete(
                stored.connection,
                pending,
                code=code,
                iss=iss,
                granted_by=grant_issuer(current),
            )
        except TokenRefused as refused:
            raise OAuthGrantRefused(
                f"connection {pending.name!r}: the authorization server refused the code: "
                f"{refused}; begin again",
                connection=pending.name,
                detail=str(refused),
            ) from None
        await sessions.blocking(grants.put_grant, *key, grant)
        async with sessions.lock(key):
            session = await sessions.replace_session(stored)
        await sessions.first_attempt(session)
        return await sessions.describe(*key)

"""A session's OAuth grant kept usable: `TokenKeeper` reads the tokens from the database and
renews them before they expire and after a 401; `GrantAuth` puts its bearer token on every
request of the session's HTTP client. Not the MCP SDK's `OAuthClientProvider`: that refreshes
with no coordination between processes, and here a refresh takes the grant's row lock, so
that with many sidecars on one database a rotating refresh token is spent once
(docs/security.md)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import anyio
import httpx2
from mcp.client.auth.utils import (
    extract_field_from_www_auth,
    extract_scope_from_www_auth,
    union_scopes,
)
from mcp.shared.auth import OAuthToken

from psych_sidecar.domain.catalog import (
    AuthKind,
    AuthorizationReason,
    OAuthGrant,
    OAuthRepository,
    StoredConnection,
)
from psych_sidecar.domain.errors import SidecarError
from psych_sidecar.domain.runlog import RunBlocking
from psych_sidecar.mcp.oauth.discovery import Discovery
from psych_sidecar.mcp.oauth.flows import OAuthFlows

log = logging.getLogger(__name__)


class AuthorizationNeeded(Exception):
    """The connection cannot be used until it is authorized (again)."""

    def __init__(self, reason: AuthorizationReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


class TokenKeeper:
    """One session's OAuth tokens: read from the database, renewed before they expire and
    after a 401, each renewal under the grant's row lock (one sidecar at a time; the others
    read its result). `required` says why the connection needs authorizing, once known."""

    def __init__(
        self,
        stored: StoredConnection,
        flows: OAuthFlows,
        store: OAuthRepository,
        blocking: RunBlocking,
        on_token: Callable[[str], None],
    ) -> None:
        self._stored = stored
        self._flows = flows
        self._store = store
        self._blocking = blocking
        # Told every access token (and refresh token) the keeper holds, for scrubbing.
        self._on_token = on_token
        self._grant: OAuthGrant | None = None
        self.required: AuthorizationReason | None = None
        self._lock = anyio.Lock()

    def held_token(self) -> str:
        """The access token held now, renewed or not; "" without one."""
        if self._grant is None:
            return ""
        return OAuthToken.model_validate_json(self._grant.tokens_json).access_token

    @property
    def expire_time(self) -> datetime | None:
        return None if self._grant is None else self._grant.expire_time

    def _take(self, grant: OAuthGrant | None) -> OAuthGrant:
        auth = self._stored.connection.auth
        assert auth is not None
        if grant is None:
            if auth.kind is AuthKind.CLIENT_CREDENTIALS:
                raise _NoGrantYet
            self.required = AuthorizationReason.NEVER_SIGNED_IN
            raise AuthorizationNeeded(self.required)
        self._grant = grant
        if grant.authorization_reason is not None:
            self.required = grant.authorization_reason
            raise AuthorizationNeeded(grant.authorization_reason)
        self.required = None
        token = OAuthToken.model_validate_json(grant.tokens_json)
        self._on_token(token.access_token)
        if token.refresh_token:
            self._on_token(token.refresh_token)
        return grant

    def _expiring(self, grant: OAuthGrant) -> bool:
        if grant.expire_time is None:
            return False
        token = OAuthToken.model_validate_json(grant.tokens_json)
        lifetime = token.expires_in or 0
        # A margin of a fifth of the lifetime, at most the operator's: tokens of a few seconds
        # (tests) are renewed shortly before expiry, not on every request.
        margin = min(self._flows.settings.refresh_margin_seconds, lifetime / 5)
        return datetime.now(UTC) + timedelta(seconds=margin) >= grant.expire_time

    async def access_token(self) -> str:
        """A current access token, renewed first when it is about to expire. Raises
        AuthorizationNeeded when there is none to be had without the user."""
        async with self._lock:
            grant = self._grant
            if grant is None or self.required is not None:
                try:
                    grant = self._take(
                        await self._blocking(
                            self._store.get_grant,
                            self._stored.connection.tenant,
                            self._stored.connection.name,
                        )
                    )
                except _NoGrantYet:
                    grant = await self._first_client_credentials()
            if self._expiring(grant):
                grant = await self._renew(grant.tokens_json)
            return OAuthToken.model_validate_json(grant.tokens_json).access_token

    async def after_rejection(self, rejected: str) -> str:
        """The server answered 401 to `rejected`: renew (unless another call or sidecar
        already did) and return the new token."""
        async with self._lock:
            grant = self._grant
            if grant is None:
                raise AuthorizationNeeded(self.required or AuthorizationReason.NEVER_SIGNED_IN)
            if OAuthToken.model_validate_json(grant.tokens_json).access_token != rejected:
                return OAuthToken.model_validate_json(grant.tokens_json).access_token
            grant = await self._renew(grant.tokens_json, force=True)
            return OAuthToken.model_validate_json(grant.tokens_json).access_token

    async def mark_required(
        self, reason: AuthorizationReason, challenged_scope: str | None = None
    ) -> None:
        """The server refused what only the user can fix (a token just renewed, a missing
        scope): stored with the grant, so every sidecar's session waits for a new sign-in
        instead of reconnecting with the same tokens. `challenged_scope`: the scope an
        insufficient_scope refusal named."""
        self.required = reason
        connection = self._stored.connection

        def required(current: OAuthGrant) -> OAuthGrant:
            metadata_json = current.metadata_json
            if challenged_scope:
                # What the refusal asked for, kept for the next sign-in (step_up_scope).
                discovery = Discovery.from_json(metadata_json)
                metadata_json = replace(
                    discovery,
                    challenged_scope=union_scopes(discovery.challenged_scope, challenged_scope),
                ).to_json()
            return replace(current, authorization_reason=reason, metadata_json=metadata_json)

        await self._blocking(self._store.renew_grant, connection.tenant, connection.name, required)

    async def _first_client_credentials(self) -> OAuthGrant:
        stored = self._stored
        grant = await self._flows.client_credentials(stored.connection, stored.revision)
        await self._blocking(
            self._store.put_grant, stored.connection.tenant, stored.connection.name, grant
        )
        return self._take(grant)

    async def _renew(self, known_tokens: str, force: bool = False) -> OAuthGrant:
        """Renew under the grant's row lock. Runs the storage call on a storage thread, which
        holds the lock while the token request runs here on the loop."""
        loop = asyncio.get_running_loop()
        connection = self._stored.connection
        flows = self._flows
        timeout = flows.settings.request_timeout_seconds * 3

        def renew(current: OAuthGrant) -> OAuthGrant:
            if current.authorization_reason is not None:
                return current
            if current.tokens_json != known_tokens and not self._expiring(current):
                return current  # another call or sidecar renewed it meanwhile
            if current.tokens_json == known_tokens and not force and not self._expiring(current):
                return current
            return asyncio.run_coroutine_threadsafe(
                flows.refresh(connection, current), loop
            ).result(timeout)

        renewed: OAuthGrant | None = await self._blocking(
            self._store.renew_grant, connection.tenant, connection.name, renew
        )
        return self._take(renewed)


class _NoGrantYet(Exception):
    """A client-credentials connection that has no grant yet: get one."""


class GrantAuth(httpx2.Auth):
    """The bearer token of a keeper on every request of a session's HTTP client; a 401 renews
    it and sends the request once more. What cannot be fixed leaves the server's answer as it
    is and the keeper's `required` set (the session then says the user must sign in again)."""

    requires_response_body = False

    def __init__(self, keeper: TokenKeeper) -> None:
        self._keeper = keeper

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        keeper = self._keeper
        try:
            token = await keeper.access_token()
        except AuthorizationNeeded:
            response = yield request
            return
        except SidecarError as error:
            # The authorization server cannot be reached just now (a typed OAuth error, no
            # secret in it): the request goes with the token held, which may still do.
            log.warning("OAuth renewal failed: %s", error)
            token = keeper.held_token()
        if token:
            request.headers["authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 403 and (
            extract_field_from_www_auth(response, "error") == "insufficient_scope"
        ):
            await keeper.mark_required(
                AuthorizationReason.SCOPE_MISSING, extract_scope_from_www_auth(response)
            )
            return
        if response.status_code != 401:
            return
        try:
            token = await keeper.after_rejection(token)
        except AuthorizationNeeded:
            return
        except SidecarError as error:
            log.warning("OAuth renewal after a 401 failed: %s", error)
            return
        request.headers["authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401:
            await keeper.mark_required(AuthorizationReason.REFRESH_REFUSED)

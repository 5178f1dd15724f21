"""A session's OAuth grant kept usable: `TokenKeeper` reads the tokens from the database and
renews them before they expire and after a 401; `GrantAuth` puts its bearer token on every
request of the session's HTTP client. Not the MCP SDK's `OAuthClientProvider`: that refreshes
with no coordination between processes, and here a refresh claims the grant first (a
short transaction; no lock is held over the token request), so that with many sidecars on one
database a rotating refresh token is spent once (docs/security.md)."""

from __future__ import annotations

import logging
import secrets
import time
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
    RefreshClaim,
    StoredConnection,
)
from psych_sidecar.domain.errors import SidecarError
from psych_sidecar.domain.runlog import OffLoop
from psych_sidecar.mcp.oauth.discovery import Discovery
from psych_sidecar.mcp.oauth.flows import OAuthFlows

log = logging.getLogger(__name__)

# Waiting out another's refresh claim: the first pause before asking again, doubled up to
# the last.
_FIRST_CLAIM_POLL_SECONDS = 0.05
_LAST_CLAIM_POLL_SECONDS = 1.0


class AuthorizationNeeded(Exception):
    """The connection cannot be used until it is authorized (again)."""

    def __init__(self, reason: AuthorizationReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


class TokenKeeper:
    """One session's OAuth tokens: read from the database, renewed before they expire and
    after a 401, each renewal under the grant's refresh claim (one sidecar at a time; the
    others read its result). `required` says why the connection needs authorizing, once
    known."""

    def __init__(
        self,
        *,
        stored: StoredConnection,
        flows: OAuthFlows,
        store: OAuthRepository,
        blocking: OffLoop,
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
                grant = await self._renew_expiring()
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
            grant = await self._renew_refused(grant.tokens_json)
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

    async def _renew_expiring(self) -> OAuthGrant:
        """Renew the grant about to expire, unless another call or sidecar renewed it
        meanwhile."""

        def needs_refresh(current: OAuthGrant) -> bool:
            return current.authorization_reason is None and self._expiring(current)

        return await self._renew(needs_refresh)

    async def _renew_refused(self, refused_tokens: str) -> OAuthGrant:
        """Renew the grant whose tokens (`refused_tokens`) the server just refused, unless
        another call or sidecar renewed it meanwhile and the new tokens are not about to
        expire."""

        def needs_refresh(current: OAuthGrant) -> bool:
            if current.authorization_reason is not None:
                return False
            return self._expiring(current) or current.tokens_json == refused_tokens

        return await self._renew(needs_refresh)

    async def _renew(self, needs_refresh: Callable[[OAuthGrant], bool]) -> OAuthGrant:
        """Renew the grant when `needs_refresh` of it as stored now, one refresh of it at a
        time across sidecars, with no lock or transaction held over the token request: the
        refresh is claimed in one short transaction, the token endpoint asked, and the result
        stored in another only while the claim is still this call's. Another's live claim is
        waited out, then its result read; a claim left by a sidecar that stopped mid-refresh
        is taken over once it expires. (Calls of this session reach here one at a time: the
        keeper's lock.)"""
        connection = self._stored.connection
        key = (connection.tenant, connection.name)
        # A refresh is one guarded token request (at most request_timeout_seconds); its claim
        # lasts three times that, so it outlives the request with room to store the result.
        claim_seconds = self._flows.settings.request_timeout_seconds * 3
        claimant = secrets.token_hex(16)
        pause = _FIRST_CLAIM_POLL_SECONDS
        give_up = time.monotonic() + 2 * claim_seconds
        while True:
            found: RefreshClaim | None = await self._blocking(
                self._store.claim_refresh, *key, claimant, claim_seconds, needs_refresh
            )
            if found is None or not found.held_elsewhere:
                break
            if time.monotonic() > give_up:
                raise self._flows.guard.failed(
                    connection.name,
                    connection.url,
                    f"another refresh of its tokens did not end within {2 * claim_seconds:g} s",
                )
            await anyio.sleep(pause)
            pause = min(2 * pause, _LAST_CLAIM_POLL_SECONDS)
        if found is None or not found.claimed:
            return self._take(None if found is None else found.grant)
        try:
            renewed = await self._flows.refresh(connection, found.grant)
        except BaseException:
            # Failed or cancelled: the claim ends now rather than at its expiry, so the next
            # call (here or on another sidecar) tries at once.
            with anyio.CancelScope(shield=True):
                await self._blocking(self._store.release_refresh, *key, claimant)
            raise
        stored: OAuthGrant | None = await self._blocking(
            self._store.store_refreshed, *key, claimant, renewed
        )
        if stored is not renewed:
            log.warning(
                "MCP connection %s/%s: a refreshed grant was not stored: its claim ended first "
                "(a new sign-in, or the claim expired and another sidecar took it)",
                connection.tenant,
                connection.name,
            )
        return self._take(stored)


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

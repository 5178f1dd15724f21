"""The OAuth flows: the sign-in's two halves (authorization URL with PKCE, then the code's
exchange), client registration, refresh and client credentials, and the token requests they
make. Built from the MCP SDK's auth client pieces (`mcp.client.auth.utils`: client
registration, scope selection; its `PKCEParameters`; its `OAuthToken`,
`OAuthClientInformationFull` models; the private-key JWT assertion of its client-credentials
extension). Stateless but for the settings: what a flow carries between calls is in the
database. Tokens never leave through an error, a log line or a reply: errors quote OAuth error
codes and descriptions, scrubbed."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import secrets
import urllib.parse
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx2
import pydantic
from mcp.client.auth.exceptions import OAuthRegistrationError
from mcp.client.auth.extensions.client_credentials import SignedJWTParameters
from mcp.client.auth.oauth2 import PKCEParameters
from mcp.client.auth.utils import (
    create_client_info_from_metadata_url,
    create_client_registration_request,
    get_client_metadata_scopes,
    handle_registration_response,
    should_use_client_metadata_url,
    union_scopes,
)
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
)

from psych_sidecar.config import OAuthOutboundSettings
from psych_sidecar.domain.catalog import (
    AuthKind,
    AuthorizationReason,
    ClientKind,
    Connection,
    OAuthGrant,
    OAuthSettings,
    PendingSignIn,
    StoredConnection,
)
from psych_sidecar.domain.errors import OAuthRegistrationFailed, short
from psych_sidecar.mcp.oauth.discovery import CLIENT_NAME, Discovery, discover
from psych_sidecar.mcp.oauth.guard import MAX_OAUTH_ERROR_CHARS, OutboundGuard
from psych_sidecar.mcp.oauth.issuers import (
    bound_issuer,
    check_bound,
    check_response_issuer,
    uses_own_credentials,
)

log = logging.getLogger(__name__)

_JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


def state_digest(state: str) -> str:
    """What the database keeps of a state: its SHA-256 (hex)."""
    return hashlib.sha256(state.encode()).hexdigest()


def _oauth_error_text(response: httpx2.Response) -> str:
    """An authorization server's refusal as "error: description" (no secret: a token endpoint
    echoes neither code nor token in its error fields; cut short anyway)."""
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        description = body.get("error_description")
        text = body["error"] + (f": {description}" if isinstance(description, str) else "")
    else:
        text = f"HTTP {response.status_code}"
    return short(" ".join(text.split()), MAX_OAUTH_ERROR_CHARS)


def step_up_scope(grant: OAuthGrant | None) -> str | None:
    """What a sign-in must ask for after a 403 insufficient_scope: the scopes granted and those
    the refusal named, so that escalating for one operation keeps the others' (the MCP spec's
    step-up, as the SDK's own provider does); None when the grant was not refused for a scope."""
    if grant is None or grant.authorization_reason is not AuthorizationReason.SCOPE_MISSING:
        return None
    challenged = Discovery.from_json(grant.metadata_json).challenged_scope
    granted = OAuthToken.model_validate_json(grant.tokens_json).scope
    return union_scopes(granted, challenged) if challenged else None


class TokenRefused(Exception):
    """The authorization server refused a grant (a code, a refresh token, credentials)."""


class OAuthFlows:
    """The sidecar's OAuth requests for one process: discovery, registration, the sign-in's
    two halves, refresh and client credentials. Stateless but for its settings: everything a
    flow carries between calls is in the database."""

    def __init__(self, settings: OAuthOutboundSettings) -> None:
        self.settings = settings
        self.guard = OutboundGuard(settings)

    # Sign-in, first half

    async def begin(
        self,
        stored: StoredConnection,
        existing_client: str | None,
        step_up: str | None = None,
        *,
        granted_by: str = "",
    ) -> tuple[str, str, PendingSignIn]:
        """(authorization URL, state, the pending sign-in to store). `step_up`: the scopes to
        ask for besides the usual ones, when the server refused a call for want of them.
        `granted_by`: the issuer of the connection's grant ("" without one)."""
        connection = stored.connection
        auth = connection.auth
        assert auth is not None
        discovery = await discover(self.guard, connection)
        if uses_own_credentials(auth):
            # Refused now, before the user is sent to an authorization server the client's
            # secret would then have to be presented to.
            check_bound(connection, bound_issuer(auth, None, granted_by), discovery)
        metadata = discovery.server_metadata
        scope = " ".join(auth.scopes) or get_client_metadata_scopes(
            discovery.challenged_scope,
            discovery.resource_metadata,
            metadata,
            ["authorization_code", "refresh_token"],
        )
        if step_up:
            scope = union_scopes(scope, step_up)
        client = await self._client(connection, auth, discovery, scope, existing_client)
        pkce = PKCEParameters.generate()
        state = secrets.token_urlsafe(32)
        resource = discovery.resource(connection.url)
        query = {
            "response_type": "code",
            "client_id": client.client_id,
            "redirect_uri": auth.redirect_uri,
            "state": state,
            "code_challenge": pkce.code_challenge,
            "code_challenge_method": "S256",
            "resource": resource,
        }
        if scope:
            query["scope"] = scope
        url = f"{metadata.authorization_endpoint}?{urllib.parse.urlencode(query)}"
        pending = PendingSignIn(
            state_digest=state_digest(state),
            tenant=connection.tenant,
            name=connection.name,
            revision=stored.revision,
            expire_time=datetime.now(UTC) + timedelta(seconds=self.settings.sign_in_state_seconds),
            verifier=pkce.code_verifier,
            client_json=client.model_dump_json(exclude_none=True),
            metadata_json=discovery.to_json(),
            scope=scope or "",
            resource=resource,
        )
        return url, state, pending

    async def _client(
        self,
        connection: Connection,
        auth: OAuthSettings,
        discovery: Discovery,
        scope: str | None,
        existing: str | None,
    ) -> OAuthClientInformationFull:
        """The client to sign in as: the configured one, a client metadata URL, the one
        registered at an earlier sign-in (same authorization server), or a new registration."""
        metadata = discovery.server_metadata
        if auth.client_kind is ClientKind.REGISTERED:
            return OAuthClientInformationFull(
                client_id=auth.client_id,
                client_secret=auth.client_secret or None,
                redirect_uris=[pydantic.AnyUrl(auth.redirect_uri)],
                token_endpoint_auth_method=_registered_client_auth_method(
                    metadata, bool(auth.client_secret)
                ),
            )
        if auth.client_kind is ClientKind.METADATA_URL and should_use_client_metadata_url(
            metadata, auth.client_metadata_url
        ):
            return create_client_info_from_metadata_url(
                auth.client_metadata_url, redirect_uris=[pydantic.AnyUrl(auth.redirect_uri)]
            )
        if existing:
            # Reused only at the authorization server it was registered at: a server that
            # moved to another gets a new registration there, and a new sign-in.
            known = OAuthClientInformationFull.model_validate_json(existing)
            if known.issuer == discovery.issuer and known.redirect_uris == [
                pydantic.AnyUrl(auth.redirect_uri)
            ]:
                return known
        if metadata.registration_endpoint is None:
            raise OAuthRegistrationFailed(
                f"connection {short(connection.name)!r}: the authorization server offers no "
                "dynamic client registration; configure a registered client or a client "
                "metadata URL",
                connection=short(connection.name),
                detail="no registration_endpoint",
            )
        request = create_client_registration_request(
            metadata,
            OAuthClientMetadata(
                redirect_uris=[pydantic.AnyUrl(auth.redirect_uri)],
                client_name=auth.client_name or CLIENT_NAME,
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                token_endpoint_auth_method="client_secret_post",
                scope=scope,
            ),
            str(metadata.issuer),
        )
        response = await self.guard.send(connection.name, request)
        try:
            client = await handle_registration_response(response)
        except OAuthRegistrationError:
            detail = _oauth_error_text(response)
            raise OAuthRegistrationFailed(
                f"connection {short(connection.name)!r}: dynamic client registration "
                f"refused: {detail}",
                connection=short(connection.name),
                detail=detail,
            ) from None
        _check_registered_client(connection, client)
        client.issuer = discovery.issuer
        return client

    # Sign-in, second half

    async def complete(
        self,
        connection: Connection,
        pending: PendingSignIn,
        *,
        code: str,
        iss: str | None,
        granted_by: str,
    ) -> OAuthGrant:
        """The grant for the redirect's `code` and `iss` (None: it had none). `granted_by`: the
        issuer of the connection's grant now ("" without one)."""
        auth = connection.auth
        assert auth is not None
        discovery = Discovery.from_json(pending.metadata_json)
        check_response_issuer(connection, discovery, iss)
        client = OAuthClientInformationFull.model_validate_json(pending.client_json)
        check_bound(connection, bound_issuer(auth, client, granted_by), discovery)
        data = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": auth.redirect_uri,
            "client_id": client.client_id,
            "code_verifier": pending.verifier,
            "resource": pending.resource,
        }
        token = await self._token_request(connection, discovery, client, data, auth)
        return _grant(pending.revision, token, client, discovery, None)

    # Refresh and client credentials

    async def refresh(self, connection: Connection, grant: OAuthGrant) -> OAuthGrant:
        """A renewed grant; one with authorization_reason set when the server refused."""
        auth = connection.auth
        assert auth is not None
        discovery = Discovery.from_json(grant.metadata_json)
        client = OAuthClientInformationFull.model_validate_json(grant.client_json)
        current = OAuthToken.model_validate_json(grant.tokens_json)
        check_bound(connection, bound_issuer(auth, client, discovery.issuer), discovery)
        if auth.kind is AuthKind.CLIENT_CREDENTIALS and not current.refresh_token:
            return await self.client_credentials(connection, grant.revision, discovery)
        if not current.refresh_token:
            return replace(grant, authorization_reason=AuthorizationReason.REFRESH_REFUSED)
        data = {
            "grant_type": "refresh_token",
            "refresh_token": current.refresh_token,
            "client_id": client.client_id,
            "resource": discovery.resource(connection.url, auth.resource),
        }
        try:
            token = await self._token_request(connection, discovery, client, data, auth)
        except TokenRefused as refused:
            log.warning(
                "MCP connection %s/%s: the authorization server refused to refresh: %s",
                connection.tenant,
                connection.name,
                refused,
            )
            if auth.kind is AuthKind.CLIENT_CREDENTIALS:
                return await self.client_credentials(connection, grant.revision, discovery)
            return replace(grant, authorization_reason=AuthorizationReason.REFRESH_REFUSED)
        if token.refresh_token is None:
            # RFC 6749 §6: no new refresh token means the old one stays good.
            token.refresh_token = current.refresh_token
        if token.scope is None:
            token.scope = current.scope
        return _grant(grant.revision, token, client, discovery, None)

    async def client_credentials(
        self, connection: Connection, revision: int, discovery: Discovery | None = None
    ) -> OAuthGrant:
        auth = connection.auth
        assert auth is not None
        granted_by = ""
        if discovery is None:
            discovery = await discover(self.guard, connection)
        else:
            # Renewing a grant: its authorization server, the one the credentials went to.
            granted_by = discovery.issuer
        # The secret or the signed assertion goes to the configured issuer only (the first
        # grant's, when none is configured).
        check_bound(connection, bound_issuer(auth, None, granted_by), discovery)
        client = OAuthClientInformationFull(
            client_id=auth.client_id,
            client_secret=auth.client_secret or None,
            grant_types=["client_credentials"],
            token_endpoint_auth_method="private_key_jwt"
            if auth.uses_private_key
            else "client_secret_basic",
        )
        data = {
            "grant_type": "client_credentials",
            "resource": discovery.resource(connection.url, auth.resource),
        }
        if auth.scopes:
            data["scope"] = " ".join(auth.scopes)
        try:
            token = await self._token_request(connection, discovery, client, data, auth)
        except TokenRefused as refused:
            grant = _grant(revision, OAuthToken(access_token="-"), client, discovery, None)
            log.warning(
                "MCP connection %s/%s: client credentials refused: %s",
                connection.tenant,
                connection.name,
                refused,
            )
            return replace(grant, authorization_reason=AuthorizationReason.CREDENTIALS_REFUSED)
        return _grant(revision, token, client, discovery, None)

    async def _token_request(
        self,
        connection: Connection,
        discovery: Discovery,
        client: OAuthClientInformationFull,
        data: dict[str, str],
        auth: OAuthSettings,
    ) -> OAuthToken:
        metadata = discovery.server_metadata
        headers = {
            "content-type": "application/x-www-form-urlencoded",
            "accept": "application/json",
        }
        method = client.token_endpoint_auth_method
        if method == "private_key_jwt" and not auth.private_key_pem:
            raise _unusable_client(connection, "private_key_jwt, with no private key configured")
        if method == "private_key_jwt":
            assertion = SignedJWTParameters(
                issuer=auth.client_id,
                subject=auth.client_id,
                signing_key=auth.private_key_pem,
                signing_algorithm=auth.algorithm or "RS256",
            ).create_assertion_provider()
            data = {
                **data,
                "client_id": auth.client_id,
                "client_assertion_type": _JWT_BEARER,
                "client_assertion": await assertion(discovery.issuer),
            }
        elif method == "client_secret_basic" and client.client_secret:
            pair = f"{urllib.parse.quote(client.client_id, safe='')}:" + urllib.parse.quote(
                client.client_secret, safe=""
            )
            headers["authorization"] = "Basic " + _b64(pair)
        elif method == "client_secret_post" and client.client_secret:
            data = {**data, "client_id": client.client_id, "client_secret": client.client_secret}
        request = httpx2.Request("POST", str(metadata.token_endpoint), data=data, headers=headers)
        response = await self.guard.send(connection.name, request)
        if response.status_code in (400, 401, 403):
            raise TokenRefused(_oauth_error_text(response))
        if response.status_code != 200:
            raise self.guard.failed(
                connection.name, str(metadata.token_endpoint), f"HTTP {response.status_code}"
            )
        try:
            return OAuthToken.model_validate_json(response.content)
        except pydantic.ValidationError:
            raise self.guard.failed(
                connection.name, str(metadata.token_endpoint), "the token response is not valid"
            ) from None


# What the sidecar can authenticate a dynamically registered client with at the token
# endpoint: nothing (a public client) or the secret the registration answer holds. Not
# private_key_jwt: a registered client has no key of the sidecar's.
_REGISTERED_CLIENT_METHODS = ("none", "client_secret_post", "client_secret_basic")


def _check_registered_client(connection: Connection, client: OAuthClientInformationFull) -> None:
    """Refuse a registration answer the sidecar could not sign in with, at registration rather
    than at the token request."""
    method = client.token_endpoint_auth_method or "client_secret_post"
    if method not in _REGISTERED_CLIENT_METHODS:
        raise _unusable_client(connection, f"{method}, which a registered client cannot use")


def _unusable_client(connection: Connection, what: str) -> OAuthRegistrationFailed:
    detail = f"the client authenticates at the token endpoint by {what}"
    return OAuthRegistrationFailed(
        f"connection {short(connection.name)!r}: {detail}; configure a registered client",
        connection=short(connection.name),
        detail=detail,
    )


def _registered_client_auth_method(metadata: OAuthMetadata, has_secret: bool) -> str:
    """How a pre-registered client authenticates at the token endpoint: a public one not at
    all; one with a secret by HTTP Basic (client_secret_basic, which every authorization server
    must accept, RFC 6749 §2.3.1, and the default of RFC 8414's method list) unless the server
    lists client_secret_post and not Basic."""
    if not has_secret:
        return "none"
    supported = metadata.token_endpoint_auth_methods_supported or []
    if "client_secret_post" in supported and "client_secret_basic" not in supported:
        return "client_secret_post"
    return "client_secret_basic"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# The range a token response's expires_in is clamped to (docs/security.md): at least a second,
# at most a year. Beyond it a date overflows (10^12 s is 31,000 years); a year-long access
# token is renewed yearly anyway.
MIN_TOKEN_LIFETIME_SECONDS = 1
MAX_TOKEN_LIFETIME_SECONDS = 365 * 24 * 3600


def token_lifetime(expires_in: int | None) -> int | None:
    """A token response's expires_in, clamped to [MIN_TOKEN_LIFETIME_SECONDS,
    MAX_TOKEN_LIFETIME_SECONDS]; None (no expiry named) stays None."""
    if expires_in is None:
        return None
    return max(MIN_TOKEN_LIFETIME_SECONDS, min(MAX_TOKEN_LIFETIME_SECONDS, expires_in))


def _grant(
    revision: int,
    token: OAuthToken,
    client: OAuthClientInformationFull,
    discovery: Discovery,
    reason: AuthorizationReason | None,
) -> OAuthGrant:
    # Clamped where it arrives: the stored token and its expire_time agree, and a hostile
    # number never reaches date arithmetic.
    token.expires_in = token_lifetime(token.expires_in)
    expire_time = (
        None
        if token.expires_in is None
        else datetime.now(UTC) + timedelta(seconds=token.expires_in)
    )
    return OAuthGrant(
        revision=revision,
        tokens_json=token.model_dump_json(exclude_none=True),
        client_json=client.model_dump_json(exclude_none=True),
        metadata_json=discovery.to_json(),
        expire_time=expire_time,
        authorization_reason=reason,
    )

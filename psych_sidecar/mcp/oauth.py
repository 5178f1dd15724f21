"""OAuth for HTTP connections: sign-in over two calls, client credentials, tokens kept fresh.

Built from the MCP SDK's auth client pieces (`mcp.client.auth.utils`: the RFC 9728 and
RFC 8414 discovery URLs and response handling, client registration, scope selection; its
`PKCEParameters`; its `OAuthToken`, `OAuthMetadata`, `OAuthClientInformationFull` models; the
private-key JWT assertion of its client-credentials extension). Not its `OAuthClientProvider`:
that provider runs a whole sign-in inside one HTTP request of one process (it awaits the
browser's redirect in between) and refreshes tokens with no coordination between processes.
Here a sign-in spans two RPCs, possibly on two sidecars, so its state lives sealed in the
database; and a refresh takes the grant's row lock, so that with many sidecars on one database
a rotating refresh token is spent once (docs/security.md).

Every request this module sends (discovery, registration, token) goes through `OutboundGuard`:
https only (plain http to loopback only when the operator allows it), addresses the operator
allowed, bounded redirects, response size and time. Tokens never leave through an error, a log
line or a reply: errors quote OAuth error codes and descriptions, scrubbed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import logging
import secrets
import socket
import urllib.parse
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import anyio
import httpx2
import pydantic
from mcp.client.auth.exceptions import OAuthFlowError, OAuthRegistrationError
from mcp.client.auth.extensions.client_credentials import SignedJWTParameters
from mcp.client.auth.oauth2 import PKCEParameters
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    create_client_info_from_metadata_url,
    create_client_registration_request,
    create_oauth_metadata_request,
    extract_field_from_www_auth,
    extract_resource_metadata_from_www_auth,
    extract_scope_from_www_auth,
    get_client_metadata_scopes,
    handle_auth_metadata_response,
    handle_protected_resource_response,
    handle_registration_response,
    should_use_client_metadata_url,
    union_scopes,
    validate_metadata_issuer,
)
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

from psych_sidecar.config import OAuthOutboundSettings
from psych_sidecar.domain.catalog import (
    AuthKind,
    AuthorizationReason,
    ClientKind,
    Connection,
    OAuthGrant,
    OAuthRepository,
    OAuthSettings,
    PendingSignIn,
    StoredConnection,
)
from psych_sidecar.domain.errors import Reason, SidecarError, short
from psych_sidecar.domain.runlog import OffLoop

log = logging.getLogger(__name__)

# How much of an authorization server's error an error text quotes.
_MAX_OAUTH_ERROR_CHARS = 200
_DEFAULT_CLIENT_NAME = "psych-sidecar"
_JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
_MCP_ACCEPT = "application/json, text/event-stream"


def state_digest(state: str) -> str:
    """What the database keeps of a state: its SHA-256 (hex)."""
    return hashlib.sha256(state.encode()).hexdigest()


def _without_query(url: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(not a URL)"
    return short(urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), 200)


class OutboundGuard:
    """The only way this module sends a request: every URL checked before it is requested
    (each redirect too), bounded redirects, response size and time."""

    def __init__(self, settings: OAuthOutboundSettings) -> None:
        self._settings = settings
        self._networks = tuple(
            ipaddress.ip_network(n, strict=False) for n in settings.allowed_networks
        )

    def _refused(self, connection: str, url: str, detail: str) -> SidecarError:
        return SidecarError(
            Reason.OAUTH_URL_REFUSED,
            f"connection {short(connection)!r}: will not request {_without_query(url)}: {detail}",
            connection=short(connection),
            url=_without_query(url),
            detail=detail,
        )

    def _allowed_address(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
        """ "" when the address may be requested, else why not."""
        if any(address in network for network in self._networks):
            return ""
        if address.is_loopback:
            return "" if self._settings.allow_http_loopback else "a loopback address"
        if address.is_link_local:
            return "a link-local address"
        if not address.is_global:
            return "a private or reserved address"
        return ""

    async def check(self, connection: str, url: str, *, browser: bool = False) -> None:
        """Refuse a URL the sidecar must not request (`browser`: one the user's browser will
        open, whose scheme alone is checked: the sidecar never requests it)."""
        try:
            parts = urllib.parse.urlsplit(url)
            host = parts.hostname or ""
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise self._refused(connection, url, "not a URL") from None
        if parts.scheme not in ("https", "http") or not host:
            raise self._refused(connection, url, "not an http(s) URL")
        try:
            literal: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(
                host
            )
        except ValueError:
            literal = None
        loopback_name = host == "localhost" or (literal is not None and literal.is_loopback)
        if parts.scheme == "http" and not (self._settings.allow_http_loopback and loopback_name):
            raise self._refused(
                connection, url, "not https (plain http only to loopback, when allowed)"
            )
        if browser:
            return
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            raise self.failed(connection, url, f"cannot resolve the host: {error}") from None
        for info in infos:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            why = self._allowed_address(address)
            if why:
                raise self._refused(connection, url, f"{host} is {why} ({address})")

    def failed(self, connection: str, url: str, detail: str) -> SidecarError:
        return SidecarError(
            Reason.OAUTH_DISCOVERY_FAILED,
            f"connection {short(connection)!r}: {_without_query(url)}: {detail}",
            connection=short(connection),
            url=_without_query(url),
            detail=short(detail, _MAX_OAUTH_ERROR_CHARS),
        )

    async def send(self, connection: str, request: httpx2.Request) -> httpx2.Response:
        """Send with the checks; the whole body is read (at most max_response_bytes)."""
        settings = self._settings
        try:
            with anyio.fail_after(settings.request_timeout_seconds):
                async with httpx2.AsyncClient(
                    follow_redirects=False,
                    trust_env=False,
                    timeout=settings.request_timeout_seconds,
                ) as client:
                    for _ in range(settings.max_redirects + 1):
                        await self.check(connection, str(request.url))
                        response = await client.send(request, stream=True)
                        try:
                            location = response.headers.get("location")
                            if response.is_redirect and location and request.method == "GET":
                                target = urllib.parse.urljoin(str(request.url), location)
                                request = httpx2.Request("GET", target, headers=request.headers)
                                continue
                            body = bytearray()
                            async for chunk in response.aiter_bytes():
                                body += chunk
                                if len(body) > settings.max_response_bytes:
                                    raise self.failed(
                                        connection,
                                        str(request.url),
                                        f"the response is larger than "
                                        f"{settings.max_response_bytes} bytes",
                                    )
                        finally:
                            await response.aclose()
                        return httpx2.Response(
                            response.status_code,
                            headers=response.headers,
                            content=bytes(body),
                            request=request,
                        )
                    raise self.failed(
                        connection,
                        str(request.url),
                        f"more than {settings.max_redirects} redirects",
                    )
        except TimeoutError:
            raise self.failed(
                connection,
                str(request.url),
                f"no complete answer within {settings.request_timeout_seconds:g} s",
            ) from None
        except httpx2.HTTPError as error:
            raise self.failed(connection, str(request.url), type(error).__name__) from None


@dataclass(frozen=True, slots=True)
class Discovery:
    """What discovery found for a server: its protected-resource metadata (if any), its
    authorization server's metadata, and the scope its 401 challenge named."""

    resource_metadata: ProtectedResourceMetadata | None
    server_metadata: OAuthMetadata
    challenged_scope: str | None

    def to_json(self) -> str:
        return json.dumps(
            {
                "resource": None
                if self.resource_metadata is None
                else self.resource_metadata.model_dump(mode="json", exclude_none=True),
                "server": self.server_metadata.model_dump(mode="json", exclude_none=True),
                "scope": self.challenged_scope,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Discovery:
        data = json.loads(text)
        return cls(
            resource_metadata=None
            if data["resource"] is None
            else ProtectedResourceMetadata.model_validate(data["resource"]),
            server_metadata=OAuthMetadata.model_validate(data["server"]),
            challenged_scope=data["scope"],
        )

    def resource(self, server_url: str, configured: str = "") -> str:
        """The RFC 8707 resource indicator: the configured one, else the protected-resource
        metadata's when it covers the server's URL, else the server's canonical URL."""
        if configured:
            return configured
        resource = resource_url_from_server_url(server_url)
        metadata = self.resource_metadata
        if metadata is not None and metadata.resource:
            named = str(metadata.resource)
            if check_resource_allowed(requested_resource=resource, configured_resource=named):
                return named
        return resource


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
    return short(" ".join(text.split()), _MAX_OAUTH_ERROR_CHARS)


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

    # Discovery

    async def discover(self, connection: Connection) -> Discovery:
        name = connection.name
        challenge = await self._challenge(connection)
        resource_metadata: ProtectedResourceMetadata | None = None
        pointed = extract_resource_metadata_from_www_auth(challenge) if challenge else None
        for url in build_protected_resource_metadata_discovery_urls(pointed, connection.url):
            response = await self.guard.send(name, create_oauth_metadata_request(url))
            if response.status_code >= 500 or response.status_code == 429:
                raise self.guard.failed(name, url, f"HTTP {response.status_code}")
            try:
                resource_metadata = await handle_protected_resource_response(response)
            except (OAuthFlowError, ValueError) as error:
                raise self.guard.failed(name, url, f"invalid metadata: {error}") from None
            if resource_metadata is not None:
                _check_resource(self.guard, connection, url, resource_metadata)
                break
        auth_server = (
            str(resource_metadata.authorization_servers[0])
            if resource_metadata is not None and resource_metadata.authorization_servers
            else None
        )
        server_metadata: OAuthMetadata | None = None
        tried = ""
        last_status = 0
        for url in build_oauth_authorization_server_metadata_discovery_urls(
            auth_server, connection.url
        ):
            tried = url
            response = await self.guard.send(name, create_oauth_metadata_request(url))
            last_status = response.status_code
            try:
                found, server_metadata = await handle_auth_metadata_response(response)
            except (OAuthFlowError, ValueError) as error:
                raise self.guard.failed(name, url, f"invalid metadata: {error}") from None
            if not found:
                break
            if server_metadata is not None:
                if auth_server is not None:
                    try:
                        validate_metadata_issuer(server_metadata, auth_server)
                    except OAuthFlowError as error:
                        raise self.guard.failed(name, url, str(error)) from None
                break
        if server_metadata is None and auth_server is None and last_status == 404:
            server_metadata = _default_endpoints(connection.url)
        if server_metadata is None:
            raise self.guard.failed(
                name, tried or connection.url, "no authorization server metadata found"
            )
        # Every endpoint the sidecar will request is checked now, so a sign-in is refused
        # before anything is stored, not at its second half.
        for endpoint in (server_metadata.token_endpoint, server_metadata.registration_endpoint):
            if endpoint is not None:
                await self.guard.check(name, str(endpoint))
        await self.guard.check(name, str(server_metadata.authorization_endpoint), browser=True)
        scope = extract_scope_from_www_auth(challenge) if challenge else None
        return Discovery(resource_metadata, server_metadata, scope)

    async def _challenge(self, connection: Connection) -> httpx2.Response | None:
        """The server's answer to a request without a token: its 401 names its metadata."""
        request = httpx2.Request(
            "POST",
            connection.url,
            headers={**connection.headers, "accept": _MCP_ACCEPT},
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": _DEFAULT_CLIENT_NAME, "version": "0"},
                },
            },
        )
        try:
            async with httpx2.AsyncClient(trust_env=False) as client:
                with anyio.fail_after(self.settings.request_timeout_seconds):
                    response = await client.send(request, stream=True)
                    await response.aclose()
        except (TimeoutError, httpx2.HTTPError) as error:
            raise self.guard.failed(
                connection.name,
                connection.url,
                f"the server did not answer: {type(error).__name__}",
            ) from None
        return response if response.status_code in (401, 403) else None

    # Sign-in, first half

    async def begin(
        self, stored: StoredConnection, existing_client: str | None, step_up: str | None = None
    ) -> tuple[str, str, PendingSignIn]:
        """(authorization URL, state, the pending sign-in to store). `step_up`: the scopes to
        ask for besides the usual ones, when the server refused a call for want of them."""
        connection = stored.connection
        auth = connection.auth
        assert auth is not None
        discovery = await self.discover(connection)
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
            known = OAuthClientInformationFull.model_validate_json(existing)
            if known.issuer == str(metadata.issuer) and known.redirect_uris == [
                pydantic.AnyUrl(auth.redirect_uri)
            ]:
                return known
        if metadata.registration_endpoint is None:
            raise SidecarError(
                Reason.OAUTH_REGISTRATION_FAILED,
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
                client_name=auth.client_name or _DEFAULT_CLIENT_NAME,
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
            raise SidecarError(
                Reason.OAUTH_REGISTRATION_FAILED,
                f"connection {short(connection.name)!r}: dynamic client registration "
                f"refused: {detail}",
                connection=short(connection.name),
                detail=detail,
            ) from None
        client.issuer = str(metadata.issuer)
        return client

    # Sign-in, second half

    async def complete(
        self, connection: Connection, pending: PendingSignIn, code: str
    ) -> OAuthGrant:
        auth = connection.auth
        assert auth is not None
        discovery = Discovery.from_json(pending.metadata_json)
        client = OAuthClientInformationFull.model_validate_json(pending.client_json)
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
        if discovery is None:
            discovery = await self.discover(connection)
        metadata = discovery.server_metadata
        if auth.issuer:
            try:
                validate_metadata_issuer(metadata, auth.issuer)
            except OAuthFlowError as error:
                raise self.guard.failed(connection.name, connection.url, str(error)) from None
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
                "client_assertion": await assertion(str(metadata.issuer)),
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


def _check_resource(
    guard: OutboundGuard, connection: Connection, url: str, metadata: ProtectedResourceMetadata
) -> None:
    """Refuse protected-resource metadata naming a resource other than the server (nor one it
    is part of), RFC 9728 §3.3: followed, it would send the user's sign-in, and the tokens, to
    an authorization server chosen for another resource."""
    if not metadata.resource:
        return
    named = str(metadata.resource)
    expected = resource_url_from_server_url(connection.url)
    if not check_resource_allowed(requested_resource=expected, configured_resource=named):
        raise guard.failed(
            connection.name,
            url,
            f"the protected-resource metadata is for {_without_query(named)}, not {expected}",
        )


def _default_endpoints(server_url: str) -> OAuthMetadata:
    """A server with neither protected-resource nor authorization-server metadata (the
    2025-03-26 revision of MCP allowed it): its authorization server is at its origin, with the
    default endpoints /authorize, /token and /register."""
    parts = urllib.parse.urlsplit(server_url)
    origin = f"{parts.scheme}://{parts.netloc}"
    return OAuthMetadata.model_validate(
        {
            "issuer": origin,
            "authorization_endpoint": f"{origin}/authorize",
            "token_endpoint": f"{origin}/token",
            "registration_endpoint": f"{origin}/register",
        }
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


def _grant(
    revision: int,
    token: OAuthToken,
    client: OAuthClientInformationFull,
    discovery: Discovery,
    reason: AuthorizationReason | None,
) -> OAuthGrant:
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

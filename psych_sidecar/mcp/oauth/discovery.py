"""OAuth discovery: what an MCP server and its authorization server publish (RFC 9728
protected-resource metadata, RFC 8414 authorization-server metadata, the 401 challenge), with
the MCP SDK's URL building and response handling; every request through the outbound guard."""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from dataclasses import dataclass

import anyio
import httpx2
from mcp.client.auth.exceptions import OAuthFlowError
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    create_oauth_metadata_request,
    extract_resource_metadata_from_www_auth,
    extract_scope_from_www_auth,
    handle_auth_metadata_response,
    handle_protected_resource_response,
    validate_metadata_issuer,
)
from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

from psych_sidecar.domain.catalog import Connection
from psych_sidecar.domain.errors import OAuthMetadataRefused, short
from psych_sidecar.mcp.oauth.guard import MAX_OAUTH_ERROR_CHARS, OutboundGuard, without_query

# The name the sidecar gives itself as an OAuth client and in its unauthenticated initialize.
CLIENT_NAME = "psych-sidecar"
# The wire versions the probe for a server's challenge speaks: the stateless revision first, as
# the SDK connects, then the dated revisions' handshake.
MODERN_VERSION = "2026-07-28"
LEGACY_VERSION = "2025-06-18"
_MCP_ACCEPT = "application/json, text/event-stream"


@dataclass(frozen=True, slots=True)
class Discovery:
    """What discovery found for a server: its protected-resource metadata (if any), its
    authorization server's metadata, and the scope its 401 challenge named."""

    resource_metadata: ProtectedResourceMetadata | None
    server_metadata: OAuthMetadata
    challenged_scope: str | None
    # The authorization server's issuer exactly as its metadata spelled it: what credentials
    # are bound to and an authorization response's `iss` is compared with, as strings (the
    # model's URL lowercases the host and drops a default port).
    issuer: str = ""

    def __post_init__(self) -> None:
        if not self.issuer:
            object.__setattr__(self, "issuer", str(self.server_metadata.issuer))

    def to_json(self) -> str:
        return json.dumps(
            {
                "resource": None
                if self.resource_metadata is None
                else self.resource_metadata.model_dump(mode="json", exclude_none=True),
                "server": self.server_metadata.model_dump(mode="json", exclude_none=True),
                "scope": self.challenged_scope,
                "issuer": self.issuer,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Discovery:
        """What to_json wrote; a discovery stored before the issuer was kept as spelled has
        the metadata model's."""
        data = json.loads(text)
        return cls(
            resource_metadata=None
            if data["resource"] is None
            else ProtectedResourceMetadata.model_validate(data["resource"]),
            server_metadata=OAuthMetadata.model_validate(data["server"]),
            challenged_scope=data["scope"],
            issuer=data.get("issuer") or "",
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


async def discover(guard: OutboundGuard, connection: Connection) -> Discovery:
    """What the server and its authorization server publish, found the ways the MCP spec
    allows (its 401 challenge, the RFC 9728 and RFC 8414 well-known URLs); every endpoint the
    sidecar will request checked by the guard."""
    name = connection.name
    # A connection stored before its URL met the parser is refused here, typed, not by the
    # HTTP client.
    guard.parse(name, connection.url)
    challenge = await _challenge(guard, connection)
    resource_metadata: ProtectedResourceMetadata | None = None
    pointed = extract_resource_metadata_from_www_auth(challenge) if challenge else None
    for url in build_protected_resource_metadata_discovery_urls(pointed, connection.url):
        # The challenge's URL is the server's to choose: parsed before it is requested.
        guard.parse(name, url)
        response = await guard.send(name, create_oauth_metadata_request(url))
        if response.status_code >= 500 or response.status_code == 429:
            raise guard.failed(name, url, f"HTTP {response.status_code}")
        try:
            resource_metadata = await handle_protected_resource_response(response)
        except (OAuthFlowError, ValueError) as error:
            raise guard.failed(name, url, f"invalid metadata: {error}") from None
        if resource_metadata is not None:
            _check_resource(guard, connection, url, resource_metadata)
            break
    auth_server = (
        str(resource_metadata.authorization_servers[0])
        if resource_metadata is not None and resource_metadata.authorization_servers
        else None
    )
    server_metadata: OAuthMetadata | None = None
    issuer = ""
    tried = ""
    last_status = 0
    for url in build_oauth_authorization_server_metadata_discovery_urls(
        auth_server, connection.url
    ):
        tried = url
        guard.parse(name, url)
        response = await guard.send(name, create_oauth_metadata_request(url))
        last_status = response.status_code
        try:
            found, server_metadata = await handle_auth_metadata_response(response)
        except (OAuthFlowError, ValueError) as error:
            raise guard.failed(name, url, f"invalid metadata: {error}") from None
        if not found:
            break
        if server_metadata is not None:
            issuer = _spelled_issuer(response.content)
            if auth_server is not None:
                try:
                    validate_metadata_issuer(server_metadata, auth_server)
                except OAuthFlowError as error:
                    raise metadata_refused(name, url, str(error)) from None
            break
    if server_metadata is None and auth_server is None and last_status == 404:
        server_metadata = _default_endpoints(connection.url)
    if server_metadata is None:
        raise guard.failed(name, tried or connection.url, "no authorization server metadata found")
    # Every endpoint the sidecar will request is checked now, so a sign-in is refused
    # before anything is stored, not at its second half.
    for endpoint in (server_metadata.token_endpoint, server_metadata.registration_endpoint):
        if endpoint is not None:
            await guard.check(name, str(endpoint))
    guard.check_browser_url(name, str(server_metadata.authorization_endpoint))
    scope = extract_scope_from_www_auth(challenge) if challenge else None
    return Discovery(resource_metadata, server_metadata, scope, issuer)


def _spelled_issuer(content: bytes) -> str:
    """The `issuer` of authorization-server metadata as the server spelled it ("" if it is
    not a string: the validated model's then stands)."""
    try:
        issuer = json.loads(content).get("issuer")
    except (ValueError, AttributeError):
        return ""
    return issuer if isinstance(issuer, str) else ""


def _probe_request(
    connection: Connection, message: dict[str, object], headers: dict[str, str]
) -> httpx2.Request:
    return httpx2.Request(
        "POST",
        connection.url,
        headers={**connection.headers, **headers, "accept": _MCP_ACCEPT},
        json={"jsonrpc": "2.0", **message},
    )


def _modern_probes() -> list[dict[str, object]]:
    """The 2026-07-28 wire's first requests, as the SDK sends them: `server/discover`, then
    `tools/list`, each self-contained (its version, client and capabilities in `_meta`)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": CLIENT_NAME, "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return [
        {"id": 0, "method": "server/discover", "params": {"_meta": meta}},
        {"id": 1, "method": "tools/list", "params": {"_meta": meta}},
    ]


def _legacy_probes() -> list[dict[str, object]]:
    """The dated revisions' handshake: `initialize`, `notifications/initialized`, `tools/list`
    in the session `initialize` opens."""
    return [
        {
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": LEGACY_VERSION,
                "capabilities": {},
                "clientInfo": {"name": CLIENT_NAME, "version": "0"},
            },
        },
        {"method": "notifications/initialized"},
        {"id": 1, "method": "tools/list"},
    ]


async def _challenge(guard: OutboundGuard, connection: Connection) -> httpx2.Response | None:
    """The server's answer to requests without a token: its 401 (or 403) names its metadata
    and the scope it wants. A server may let its first request through and refuse only what
    follows, so the probe goes on as a client would and takes the first refusal's challenge:
    first as the SDK connects, the 2026-07-28 way (`server/discover`, then `tools/list`), then,
    when the server refused neither with a challenge (a server of a dated revision answers
    `server/discover` with an error), with the dated revisions' `initialize` handshake."""
    answers: list[int] = []
    try:
        async with httpx2.AsyncClient(trust_env=False) as client:
            with anyio.fail_after(guard.settings.request_timeout_seconds):
                for probe in (_probe_modern, _probe_legacy):
                    challenge = await probe(client, connection, answers)
                    if challenge is not None:
                        return challenge
    except (TimeoutError, httpx2.HTTPError) as error:
        if answers:
            # It answered a request: a server, whose metadata the well-known URLs give.
            return None
        raise guard.failed(
            connection.name,
            connection.url,
            f"the server did not answer: {type(error).__name__}",
        ) from None
    return None


async def _probe_modern(
    client: httpx2.AsyncClient, connection: Connection, answers: list[int]
) -> httpx2.Response | None:
    """The first 401 or 403 of the 2026-07-28 wire's probes (each naming its version and
    method in headers), or None; each answer's status is added to `answers`. A request
    answered otherwise than with success ends the probes."""
    for message in _modern_probes():
        method = str(message["method"])
        sent = {"mcp-protocol-version": MODERN_VERSION, "mcp-method": method}
        response = await _send_probe(client, connection, message, sent, answers)
        if response.status_code in (401, 403):
            return response
        if not response.is_success:
            return None
    return None


async def _probe_legacy(
    client: httpx2.AsyncClient, connection: Connection, answers: list[int]
) -> httpx2.Response | None:
    """The same for the dated revisions' probes, sent in the session the server's first
    answer opens (ended after them)."""
    headers: dict[str, str] = {}
    try:
        for message in _legacy_probes():
            response = await _send_probe(client, connection, message, headers, answers)
            if response.status_code in (401, 403):
                return response
            if not response.is_success:
                return None
            session = response.headers.get("mcp-session-id")
            if session and "mcp-session-id" not in headers:
                headers = {"mcp-session-id": session, "mcp-protocol-version": LEGACY_VERSION}
    finally:
        if "mcp-session-id" in headers:
            # The probe's session ends here (a server may refuse: no matter).
            with contextlib.suppress(httpx2.HTTPError):
                ended = httpx2.Request(
                    "DELETE", connection.url, headers={**connection.headers, **headers}
                )
                await (await client.send(ended, stream=True)).aclose()
    return None


async def _send_probe(
    client: httpx2.AsyncClient,
    connection: Connection,
    message: dict[str, object],
    headers: dict[str, str],
    answers: list[int],
) -> httpx2.Response:
    """Send one probe, its body unread, and add its answer's status to `answers`."""
    response = await client.send(_probe_request(connection, message, headers), stream=True)
    await response.aclose()
    answers.append(response.status_code)
    return response


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
        raise metadata_refused(
            connection.name,
            url,
            f"the protected-resource metadata is for {without_query(named)}, not {expected}",
        )


def metadata_refused(connection: str, url: str, detail: str) -> OAuthMetadataRefused:
    """Metadata refused for what it says (another resource, another issuer): not retryable,
    unlike a discovery that failed (`OutboundGuard.failed`)."""
    return OAuthMetadataRefused(
        f"connection {short(connection)!r}: {without_query(url)}: {detail}",
        connection=short(connection),
        url=without_query(url),
        detail=short(detail, MAX_OAUTH_ERROR_CHARS),
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

"""OAuth discovery: what an MCP server and its authorization server publish (RFC 9728
protected-resource metadata, RFC 8414 authorization-server metadata, the 401 challenge), with
the MCP SDK's URL building and response handling; every request through the outbound guard."""

from __future__ import annotations

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
from psych_sidecar.mcp.oauth.guard import OutboundGuard, without_query

# The name the sidecar gives itself as an OAuth client and in its unauthenticated initialize.
CLIENT_NAME = "psych-sidecar"
_MCP_ACCEPT = "application/json, text/event-stream"


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
            if auth_server is not None:
                try:
                    validate_metadata_issuer(server_metadata, auth_server)
                except OAuthFlowError as error:
                    raise guard.failed(name, url, str(error)) from None
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
    await guard.check(name, str(server_metadata.authorization_endpoint), browser=True)
    scope = extract_scope_from_www_auth(challenge) if challenge else None
    return Discovery(resource_metadata, server_metadata, scope)


async def _challenge(guard: OutboundGuard, connection: Connection) -> httpx2.Response | None:
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
                "clientInfo": {"name": CLIENT_NAME, "version": "0"},
            },
        },
    )
    try:
        async with httpx2.AsyncClient(trust_env=False) as client:
            with anyio.fail_after(guard.settings.request_timeout_seconds):
                response = await client.send(request, stream=True)
                await response.aclose()
    except (TimeoutError, httpx2.HTTPError) as error:
        raise guard.failed(
            connection.name,
            connection.url,
            f"the server did not answer: {type(error).__name__}",
        ) from None
    return response if response.status_code in (401, 403) else None


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
            f"the protected-resource metadata is for {without_query(named)}, not {expected}",
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

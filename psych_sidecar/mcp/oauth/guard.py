"""The outbound address guard: every request the OAuth code sends (discovery, registration,
token) goes through `OutboundGuard`: https only (plain http to loopback only when the operator
allows it), addresses the operator allowed, bounded redirects, response size and time."""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse

import anyio
import httpx2

from psych_sidecar.config import OAuthOutboundSettings
from psych_sidecar.domain.errors import (
    OAuthDiscoveryFailed,
    OAuthUrlRefused,
    short,
)

# How much of an authorization server's error an error text quotes.
MAX_OAUTH_ERROR_CHARS = 200


def without_query(url: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(not a URL)"
    return short(urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), 200)


class OutboundGuard:
    """The only way this module sends a request: every URL checked before it is requested
    (each redirect too), bounded redirects, response size and time."""

    def __init__(self, settings: OAuthOutboundSettings) -> None:
        self.settings = settings
        self._networks = tuple(
            ipaddress.ip_network(n, strict=False) for n in settings.allowed_networks
        )

    def _refused(self, connection: str, url: str, detail: str) -> OAuthUrlRefused:
        return OAuthUrlRefused(
            f"connection {short(connection)!r}: will not request {without_query(url)}: {detail}",
            connection=short(connection),
            url=without_query(url),
            detail=detail,
        )

    def _allowed_address(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
        """ "" when the address may be requested, else why not."""
        if any(address in network for network in self._networks):
            return ""
        if address.is_loopback:
            return "" if self.settings.allow_http_loopback else "a loopback address"
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
        if parts.scheme == "http" and not (self.settings.allow_http_loopback and loopback_name):
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

    def failed(self, connection: str, url: str, detail: str) -> OAuthDiscoveryFailed:
        return OAuthDiscoveryFailed(
            f"connection {short(connection)!r}: {without_query(url)}: {detail}",
            connection=short(connection),
            url=without_query(url),
            detail=short(detail, MAX_OAUTH_ERROR_CHARS),
        )

    async def send(self, connection: str, request: httpx2.Request) -> httpx2.Response:
        """Send with the checks; the whole body is read (at most max_response_bytes)."""
        settings = self.settings
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

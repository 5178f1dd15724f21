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
from psych_sidecar.domain.catalog import http_url_problem
from psych_sidecar.domain.errors import (
    OAuthDiscoveryFailed,
    OAuthUrlRefused,
    short,
)

# How much of an authorization server's error an error text quotes.
MAX_OAUTH_ERROR_CHARS = 200

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 prefixes that carry an IPv4 address a translator reaches: NAT64's well-known prefix
# (RFC 6052, the IPv4 address in the last 32 bits) and its local-use prefix (RFC 8215, where
# the IPv4 address sits depends on the operator's prefix length, so it is refused whole).
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
# The deprecated IPv4-compatible form ::a.b.c.d (RFC 4291 §2.5.5.1); :: and ::1 are not it.
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """The IPv4 addresses an IPv6 address reaches through a translator or a tunnel, each with
    the form's name: NAT64 (64:ff9b::/96), 6to4 (2002::/16), Teredo (2001::/32: its server
    and its client) and IPv4-compatible (::a.b.c.d). IPv4-mapped addresses (::ffff:a.b.c.d)
    are the IPv4 address itself, and judged as it (`OutboundGuard`)."""
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _NAT64_WELL_KNOWN:
        found.append(("NAT64", low32))
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        found.append(("IPv4-compatible", low32))
    if address.sixtofour is not None:
        found.append(("6to4", address.sixtofour))
    if address.teredo is not None:
        server, client = address.teredo
        found += [("Teredo", server), ("Teredo", client)]
    return found


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

    def _allowed_address(self, address: IPAddress) -> str:
        """ "" when the address may be requested, else why not. An IPv6 address that carries
        an IPv4 one (`embedded_ipv4`) is judged by that IPv4 address too."""
        if any(address in network for network in self._networks):
            return ""
        if isinstance(address, ipaddress.IPv6Address):
            if address.ipv4_mapped is not None:
                # The IPv4 address itself on a dual-stack socket: judged as that address.
                why = self._allowed_address(address.ipv4_mapped)
                return f"{why} ({address.ipv4_mapped}, IPv4-mapped)" if why else ""
            if address in _NAT64_LOCAL_USE:
                return "a local-use NAT64 address (64:ff9b:1::/48)"
            for form, embedded in embedded_ipv4(address):
                # Reached through a translator or tunnel, whose loopback is not this host's.
                why = "a loopback address" if embedded.is_loopback else ""
                why = why or self._allowed_address(embedded)
                if why:
                    return f"{why} ({embedded}, embedded in a {form} address)"
        if address.is_loopback:
            return "" if self.settings.allow_http_loopback else "a loopback address"
        if address.is_link_local:
            return "a link-local address"
        if not address.is_global:
            return "a private or reserved address"
        return ""

    def parse(self, connection: str, url: str) -> None:
        """Refuse a URL that is not one an http(s) request can be built from: what an OAuth or
        MCP server hands the sidecar meets this parser (the one `PutConnection` uses) before
        anything else parses it."""
        problem = http_url_problem(url)
        if problem:
            raise self._refused(connection, url, f"not a valid http(s) URL: {problem}")

    async def check(self, connection: str, url: str) -> None:
        """Refuse a URL the sidecar must not request: its scheme, then every address its
        host resolves to."""
        host, port = self._checked_scheme(connection, url)
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as error:
            raise self.failed(connection, url, f"cannot resolve the host: {error}") from None
        for info in infos:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            why = self._allowed_address(address)
            if why:
                raise self._refused(connection, url, f"{host} is {why} ({address})")

    def check_browser_url(self, connection: str, url: str) -> None:
        """Refuse a URL the user's browser will open: its scheme alone is checked, since the
        sidecar never requests it."""
        self._checked_scheme(connection, url)

    def _checked_scheme(self, connection: str, url: str) -> tuple[str, int]:
        """Refuse a URL that is not https (nor plain http to loopback, when allowed); its
        host and port."""
        self.parse(connection, url)
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
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
        return host, port

    def _redirect_target(self, connection: str, request: httpx2.Request, location: str) -> str:
        """Where a redirect's `Location` points, parsed here before anything else reads it."""
        try:
            target = urllib.parse.urljoin(str(request.url), location)
        except ValueError:
            target = location
        self.parse(connection, target)
        return target

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
                                target = self._redirect_target(connection, request, location)
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
        except httpx2.InvalidURL:
            # What the parser let through and the HTTP client still would not build.
            raise self._refused(
                connection, str(request.url), "not a URL the HTTP client can request"
            ) from None

"""The one parser of an http(s) URL: a connection's URL and redirect URI when the host puts the
connection, and every URL an MCP or OAuth server hands the sidecar (metadata URLs, endpoints,
redirect `Location`s) before it is requested. What passes here parses the same way in
`urllib`, the HTTP client and the MCP SDK's (pydantic) URL type, so nothing accepted at
`PutConnection` fails later at `BeginSignIn`, and a hostile URL is a typed refusal, not an
exception of whichever parser met it first."""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

import pydantic

from psych_sidecar.domain.errors import short

# The longest URL accepted; longer ones are refused, not cut.
MAX_URL_CHARS = 4096

# A host name: dot-separated labels of letters, digits, '-' and '_' (no leading or trailing
# '-'), 253 characters at most; non-ASCII names are given in their punycode (xn--) form.
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
# WHATWG's "ends in a number": a host whose last label is numeric is an IPv4 address, and is
# read (by browsers, pydantic and getaddrinfo) in octal, hex or short forms too; the sidecar
# takes the four-decimal form only.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")

_ANY_URL: pydantic.TypeAdapter[pydantic.AnyUrl] = pydantic.TypeAdapter(pydantic.AnyUrl)


def http_url_problem(url: str) -> str:
    """Why `url` is not an http(s) URL the sidecar will parse; "" when it is one."""
    if not url:
        return "empty"
    if len(url) > MAX_URL_CHARS:
        return f"longer than {MAX_URL_CHARS} characters"
    if any(c.isspace() or not c.isprintable() for c in url):
        return "holds whitespace or control characters"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as error:
        return f"not a URL ({short(str(error), 80)})"
    if parts.scheme not in ("http", "https"):
        return "not an http:// or https:// URL"
    if "\\" in parts.netloc:
        return "a backslash in the host"
    host = parts.hostname or ""
    if not host:
        return "no host"
    if port == 0:
        return "port 0"
    problem = _host_problem(host, bracketed="[" in parts.netloc)
    if problem:
        return problem
    try:
        _ANY_URL.validate_python(url)
    except pydantic.ValidationError:
        return "not a URL (it does not parse as one)"
    return ""


def _host_problem(host: str, *, bracketed: bool) -> str:
    if bracketed:
        if "%" in host:
            return "an IPv6 address with a zone"
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "not an IPv6 address in brackets"
        return ""
    if not host.isascii():
        return "a non-ASCII host name (give it in its xn-- form)"
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1] or (labels[-2] if len(labels) > 1 else "")):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "an IPv4 address must be four decimal numbers without leading zeros"
        return ""
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return "not a host name"
    return ""

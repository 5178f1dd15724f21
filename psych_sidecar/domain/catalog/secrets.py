"""What of a connection is secret, and how it is kept out of replies, logs and errors.

Secret: env and header values (never returned at all), and the URL's user-info and query
values (an API key in `?key=` is as secret as one in a header). The URL comes back with
those parts replaced by REDACTED; every error text and log line about a connection goes
through `Scrubber`, which also catches a secret quoted by a library (an HTTP client's error
quoting the URL, a server echoing a token).
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import replace

from psych_sidecar.domain.catalog.connections import Connection

REDACTED = "REDACTED"
# Secrets shorter than this are not searched for in free text: "1" or "on" would blank out
# unrelated characters, and are no secret worth the name.
_MIN_SCRUBBED_CHARS = 4


def redact_url(url: str) -> str:
    """The URL without its user-info and with every query value replaced by REDACTED.
    Idempotent; a URL that does not parse is replaced whole."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return REDACTED
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    if parts.username is not None or parts.password is not None:
        netloc = f"{REDACTED}@{netloc}"
    query = "&".join(
        f"{name}={REDACTED}" if separator else name
        for name, separator, _value in (item.partition("=") for item in parts.query.split("&"))
        if name or separator
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def without_secrets(connection: Connection) -> Connection:
    """The connection as it may be shown: no env, no headers, the URL redacted."""
    url = redact_url(connection.url) if connection.url else ""
    auth = connection.auth.without_secrets() if connection.auth is not None else None
    return replace(connection, env={}, headers={}, url=url, auth=auth)


def _url_secrets(url: str) -> set[str]:
    found: set[str] = set()
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return {url}
    userinfo, at, _host = parts.netloc.rpartition("@")
    if at:
        found.add(userinfo)
        found.update(userinfo.split(":", 1))
    for item in parts.query.split("&"):
        _name, separator, value = item.partition("=")
        if separator and value:
            found.update({value, urllib.parse.unquote_plus(value)})
    found.update({urllib.parse.unquote(value) for value in list(found)})
    return found


def quoted_forms(secret: str) -> set[str]:
    """The ways a library may quote a secret in its text: as it is; escaped as a Python string
    or bytes repr (a CR/LF kept as the four characters \\r\\n, as an HTTP client's "Illegal
    header value" error has it) or as JSON; percent-encoded; its whitespace runs flattened to
    one space (a header quoted on one line); and, for one spanning lines, each of its lines.
    Forms shorter than the scrubbing minimum are left out."""
    forms = {
        secret,
        " ".join(secret.split()),
        repr(secret)[1:-1],
        repr(secret.encode("utf-8", "surrogateescape"))[2:-1],
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        urllib.parse.quote(secret, safe=""),
        urllib.parse.quote_plus(secret, safe=""),
    }
    if "\n" in secret or "\r" in secret:
        forms.update(secret.splitlines())
    return {form for form in forms if len(form) >= _MIN_SCRUBBED_CHARS}


class Scrubber:
    """Removes a connection's secrets from free text (errors, log lines, server output)."""

    def __init__(self, connection: Connection) -> None:
        self._url = connection.url
        self._redacted_url = redact_url(connection.url) if connection.url else ""
        secrets = {*connection.env.values(), *connection.headers.values()}
        if connection.auth is not None:
            secrets.update(connection.auth.secrets())
        if connection.url:
            secrets |= _url_secrets(connection.url)
        forms: set[str] = set()
        for secret in secrets:
            forms |= quoted_forms(secret)
        # Longest first, so a secret containing another is replaced whole.
        self._secrets = sorted(forms, key=len, reverse=True)

    def add(self, secret: str) -> None:
        """Scrub this secret too (a token the connection was given after it was put), in
        every form a library may quote it."""
        new = quoted_forms(secret) - set(self._secrets)
        if new:
            self._secrets = sorted([*self._secrets, *new], key=len, reverse=True)

    def __call__(self, text: str) -> str:
        if self._url and self._url in text:
            text = text.replace(self._url, self._redacted_url)
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

"""Transports for a connection: stdio (an operator-allowed command only), streamable HTTP, SSE.

Each transport's read stream is watched, so a session's owner learns the moment its server
goes away (a stdio process exiting, an SSE stream ending) instead of at the next call. An HTTP
transport's responses are watched too: the SDK turns a 401 or 403 into a bare "Server returned
an error response", so the status and the server's challenge are kept here for the error texts.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import anyio
import httpx2
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from psych_sidecar.config import StdioCommand
from psych_sidecar.domain.catalog import Connection, TransportKind, env_name_allowed
from psych_sidecar.mcp.stderr import StderrTail
from psych_sidecar.mcp.stdio import stdio_transport
from psych_sidecar.telemetry import logs

# The HTTP and MCP libraries' INFO and DEBUG lines quote URLs, headers and messages, tokens
# included: they log from WARNING on, whatever the sidecar's level (telemetry/logs.py).
logs.quiet_libraries()

Item = SessionMessage | Exception
# The read and write streams a transport yields (the SDK's TransportStreams).
Streams = tuple[Any, Any]
# The SDK's defaults for HTTP: a server may hold a response stream open for a long time.
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
# The largest server-sent event (one MCP message over streamable HTTP) the sidecar reads.
MAX_SSE_EVENT_BYTES = 256 * 1024 * 1024
# How much of a server's WWW-Authenticate challenge an error quotes: enough for its scheme,
# realm, scope and resource_metadata URL; the rest is the server's to bloat.
MAX_CHALLENGE_CHARS = 300


@dataclass(frozen=True, slots=True)
class HttpRefusal:
    """A server's answer of HTTP 401 or 403: the request lacked (or had insufficient)
    authorization. `challenge` is its WWW-Authenticate header, flattened and cut short."""

    status: int
    challenge: str

    def __str__(self) -> str:
        if self.status == 401:
            text = "HTTP 401 Unauthorized: the server requires authorization (sign-in)"
        else:
            text = "HTTP 403 Forbidden: the server refused the credentials it was given"
        return f"{text}; WWW-Authenticate: {self.challenge}" if self.challenge else text


class HttpRefusals:
    """The authorization refusals one session's HTTP client has seen: the last one, and how
    many (so a call can tell whether one arrived while it ran). `scrub` is the connection's
    scrubber: a challenge may echo the token it refused, and is scrubbed before it is
    flattened and cut short (a token cut in two would be found by neither half)."""

    def __init__(self, scrub: Callable[[str], str] | None = None) -> None:
        self.last: HttpRefusal | None = None
        self.count = 0
        self._scrub = scrub

    async def on_response(self, response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            challenge = response.headers.get("www-authenticate", "")
            if self._scrub is not None:
                challenge = self._scrub(challenge)
            challenge = re.sub(r"\s+", " ", challenge).strip()
            if len(challenge) > MAX_CHALLENGE_CHARS:
                challenge = challenge[: MAX_CHALLENGE_CHARS - 1] + "…"
            self.last = HttpRefusal(response.status_code, challenge)
            self.count += 1

    def client_factory(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        """An HTTP client that reports its refusals here (the SDK's client-factory signature,
        which the SSE transport takes)."""
        return httpx2.AsyncClient(
            headers=headers,
            timeout=timeout or _HTTP_TIMEOUT,
            auth=auth,
            event_hooks={"response": [self.on_response]},
        )


class _WatchedReadStream:
    """A transport's read stream that sets `closed` once the transport stops delivering."""

    def __init__(self, inner: Any, closed: anyio.Event) -> None:
        self._inner = inner
        self._closed = closed

    def __getattr__(self, name: str) -> Any:
        # The SDK reads optional attributes such as `last_context` with getattr.
        return getattr(self._inner, name)

    async def receive(self) -> Item:
        try:
            item: Item = await self._inner.receive()
            return item
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._closed.set()
            raise

    async def aclose(self) -> None:
        self._closed.set()
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Item:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def stdio_parameters(
    connection: Connection, commands: Mapping[str, StdioCommand]
) -> StdioServerParameters:
    """The process to start: the operator's argv and env, the connection's extra args and env.

    Validation refused unknown commands at put time; a command removed from the
    configuration since then is refused here, so the API alone never starts anything.
    """
    command = commands.get(connection.command)
    if command is None:
        raise PermissionError(
            f"command {connection.command!r} is no longer allowed by the sidecar's configuration"
        )
    if connection.args and not command.allow_extra_args:
        raise PermissionError(f"command {connection.command!r} no longer takes extra arguments")
    refused = sorted(n for n in connection.env if not env_name_allowed(n, command.allowed_env))
    if refused:
        raise PermissionError(
            f"command {connection.command!r} no longer allows the connection to set "
            f"{', '.join(refused)} (mcp_commands allowed_env)"
        )
    return StdioServerParameters(
        command=command.argv[0],
        args=[*command.argv[1:], *connection.args],
        env={**command.env, **connection.env},
    )


@asynccontextmanager
async def _streamable_http(
    url: str, headers: Mapping[str, str], refusals: HttpRefusals, auth: httpx2.Auth | None
) -> AsyncIterator[Streams]:
    async with (
        refusals.client_factory(headers=dict(headers), auth=auth) as http_client,
        # Tool results of many megabytes are ordinary here, but one event is still bounded:
        # a server streaming without end must not take the sidecar's memory with it.
        streamable_http_client(
            url, http_client=http_client, max_sse_event_size=MAX_SSE_EVENT_BYTES
        ) as streams,
    ):
        yield streams


@asynccontextmanager
async def _stdio(
    parameters: StdioServerParameters, stderr: StderrTail, max_line_bytes: int
) -> AsyncIterator[Streams]:
    # The server's stderr goes to a pipe read into its connection's bounded tail, never
    # straight into the sidecar's own stderr (mcp/stderr.py).
    with stderr.pipe() as errlog:
        # The SDK's process handling with a linear, bounded reader (mcp/stdio.py).
        async with stdio_transport(parameters, errlog, max_line_bytes) as streams:
            yield streams


def _base_transport(
    connection: Connection,
    commands: Mapping[str, StdioCommand],
    stderr: StderrTail,
    refusals: HttpRefusals,
    auth: httpx2.Auth | None,
    max_line_bytes: int,
) -> AbstractAsyncContextManager[Any]:
    if connection.transport is TransportKind.STDIO:
        return _stdio(stdio_parameters(connection, commands), stderr, max_line_bytes)
    if connection.transport is TransportKind.STREAMABLE_HTTP:
        return _streamable_http(connection.url, connection.headers, refusals, auth)
    return sse_client(
        connection.url,
        headers=dict(connection.headers),
        httpx_client_factory=refusals.client_factory,
        auth=auth,
    )


@asynccontextmanager
async def open_transport(
    connection: Connection,
    commands: Mapping[str, StdioCommand],
    closed: anyio.Event,
    stderr: StderrTail,
    refusals: HttpRefusals,
    auth: httpx2.Auth | None = None,
    *,
    max_line_bytes: int,
) -> AsyncIterator[Streams]:
    """The connection's transport; `closed` is set when it stops delivering messages; a
    stdio server's stderr is kept in `stderr`, an HTTP server's 401 and 403 in `refusals`;
    `auth` (an OAuth connection's tokens) signs every HTTP request; a stdio server's line
    longer than `max_line_bytes` ends the connection."""
    async with _base_transport(connection, commands, stderr, refusals, auth, max_line_bytes) as (
        read_stream,
        write_stream,
    ):
        yield _WatchedReadStream(read_stream, closed), write_stream

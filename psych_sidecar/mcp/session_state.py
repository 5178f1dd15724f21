"""What one connection's owner task, its tool calls and its catalogue refreshes share: the
connection, its visible state and attempts, the live client, and how its failures read.

Every error text and log line about the connection passes through its scrubber: a library
error may quote the URL, with its user-info and query (docs/security.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import anyio
import httpx2
import mcp_types as types
from mcp import MCPError

from psych_sidecar.domain.catalog import (
    AuthorizationReason,
    ConnectionState,
    Scrubber,
    StoredConnection,
    authorization_line,
)
from psych_sidecar.mcp.stderr import StderrTail
from psych_sidecar.mcp.transport import HttpRefusal, HttpRefusals
from psych_sidecar.telemetry import logs

if TYPE_CHECKING:
    from mcp import Client

    from psych_sidecar.mcp.oauth.grants import TokenKeeper

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 500


@dataclass(frozen=True, slots=True)
class SessionStatus:
    state: ConnectionState
    last_error: str
    state_time: datetime
    # Why it is AUTHORIZATION_REQUIRED; None in every other state.
    authorization_reason: AuthorizationReason | None = None


def describe_error(error: BaseException) -> str:
    """A one-line account of a failure, leaves of exception groups included."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(describe_error(e) for e in error.exceptions))
    if isinstance(error, TimeoutError):
        return "timed out"
    if not str(error) and isinstance(
        error, (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)
    ):
        # These say nothing of themselves: what they mean here.
        return f"the transport's stream ended ({type(error).__name__})"
    text = str(error) or type(error).__name__
    if isinstance(error, MCPError):
        text = f"MCP error {error.code}: {error.message}"
    return text[:MAX_ERROR_CHARS]


def _http_status_error(error: BaseException) -> bool:
    """Whether the error is an HTTP error status: httpx's, or the SDK's JSON-RPC stand-in for
    one (INTERNAL_ERROR "Server returned an error response", the status left out)."""
    if isinstance(error, BaseExceptionGroup):
        return any(_http_status_error(leaf) for leaf in error.exceptions)
    if isinstance(error, httpx2.HTTPStatusError):
        return True
    return isinstance(error, MCPError) and error.code == types.INTERNAL_ERROR


def mcp_error(error: BaseException) -> MCPError | None:
    """The MCP error the failure is, or the first among its group's leaves."""
    if isinstance(error, MCPError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = mcp_error(inner)
            if found is not None:
                return found
    return None


class SessionState:
    """One connection's shared state. The owner task connects and sets `client`; calls and
    refreshes read it, and set `broken` when they find the session unusable (the owner then
    ends it)."""

    def __init__(
        self,
        stored: StoredConnection,
        keeper: Callable[[Scrubber], TokenKeeper] | None = None,
    ) -> None:
        self.stored = stored
        self.scrub = Scrubber(stored.connection)
        # Lines of the HTTP and MCP libraries are scrubbed with it too (telemetry/logs.py).
        logs.scrub_library_lines_with(self.scrub)
        self.stderr = StderrTail(f"{self.key[0]}/{self.key[1]}", self.scrub)
        # An OAuth connection's tokens (None for the others); it adds every token it holds to
        # the scrubber, so no error text or log line can quote one.
        self.keeper = keeper(self.scrub) if keeper is not None else None
        # The live client; None when no call may start (not connected, or going away).
        self.client: Client | None = None
        self._status = SessionStatus(ConnectionState.CONNECTING, "", datetime.now(UTC))
        self.stopping = anyio.Event()
        self.broken = anyio.Event()
        # Attempts that ended (connected or failed), and an event set when the next one does.
        self.finished_attempts = 0
        self._attempt_finished = anyio.Event()
        # The current attempt's HTTP 401/403 answers, which the SDK reports only as
        # "Server returned an error response".
        self.refusals = HttpRefusals(self.scrub)

    @property
    def key(self) -> tuple[str, str]:
        return self.stored.connection.tenant, self.stored.connection.name

    @property
    def status(self) -> SessionStatus:
        return self._status

    def new_attempt(self) -> None:
        """A connection attempt starts: the last one's refusals and breakage are forgotten."""
        self.refusals = HttpRefusals(self.scrub)
        self.broken = anyio.Event()

    def set_status(
        self,
        state: ConnectionState,
        error: str = "",
        reason: AuthorizationReason | None = None,
    ) -> None:
        """The time changes only with the state, so a turn resolved during an outage reads
        the same state, time and (usually) error until the server is back."""
        previous = self._status
        if state is ConnectionState.CONNECTED:
            error = ""
        elif not error:
            error = previous.last_error
        if state is previous.state:
            if (error, reason) != (previous.last_error, previous.authorization_reason):
                self._status = SessionStatus(state, error, previous.state_time, reason)
            return
        self._status = SessionStatus(state, error, datetime.now(UTC), reason)

    def authorization_required(self) -> AuthorizationReason | None:
        """Why the connection needs authorizing, when its keeper knows it does."""
        return self.keeper.required if self.keeper is not None else None

    def set_authorization_required(self, reason: AuthorizationReason) -> None:
        if self._status.state is not ConnectionState.AUTHORIZATION_REQUIRED:
            log.warning("MCP connection %s/%s needs authorizing: %s", *self.key, reason.value)
        self.set_status(
            ConnectionState.AUTHORIZATION_REQUIRED,
            authorization_line(self.stored.connection.name, reason),
            reason,
        )

    def finish_attempt(self) -> None:
        self.finished_attempts += 1
        finished, self._attempt_finished = self._attempt_finished, anyio.Event()
        finished.set()

    def end_attempts(self) -> None:
        """The owner task ends: no attempt follows, so nobody waits for one."""
        self._attempt_finished.set()

    async def wait_attempt(self, after: int, wait_seconds: float) -> SessionStatus:
        """Wait until more than `after` attempts have ended, or `wait_seconds` passed."""
        with anyio.move_on_after(wait_seconds):
            while self.finished_attempts <= after and not self.stopping.is_set():
                await self._attempt_finished.wait()
        return self._status

    def describe(self, error: BaseException, refusals_before: int = 0) -> str:
        """The error, or the 401/403 behind it (see `refusal`)."""
        refusal = self.refusal(error, refusals_before)
        return self.scrub(str(refusal) if refusal else describe_error(error))

    def refusal(self, error: BaseException, refusals_before: int) -> HttpRefusal | None:
        """The server's 401 or 403 that `error` stands for: the error is an HTTP status error
        (or the SDK's status-less stand-in for one) and a refusal arrived since the
        attempt's first `refusals_before`."""
        if self.refusals.count > refusals_before and _http_status_error(error):
            return self.refusals.last
        return None

    def unreachable_text(self) -> str:
        status = self._status
        server = self.stored.connection.name
        if status.authorization_reason is not None:
            return authorization_line(server, status.authorization_reason)
        if status.state is ConnectionState.CONNECTING:
            return f"MCP server {server!r} is still connecting; try again shortly."
        since = status.state_time.strftime("%Y-%m-%dT%H:%M:%SZ")
        reason = f": {status.last_error}" if status.last_error else ""
        return f"MCP server {server!r} is unreachable since {since}{reason}."

"""One connection's MCP session, owned by one long-lived task.

The owner task enters and exits the SDK client (anyio cancel scopes must be exited by the
task that entered them); everyone else only calls into the live session, under a deadline.
The owner reconnects with backoff and keeps a visible state. A session is composed of its
shared state (`session_state.py`), its tool calls (`tool_calls.py`) and its catalogue
refreshes (`catalog_refresh.py`); this module is the owner task alone.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.session import ClientSession

from psych_sidecar import __version__
from psych_sidecar.config import StdioCommand
from psych_sidecar.domain.calls import SchemaValidators
from psych_sidecar.domain.catalog import (
    STATELESS_REVISIONS,
    CatalogWrite,
    ConnectionState,
    McpToolResult,
    Scrubber,
    StoredConnection,
)
from psych_sidecar.mcp.catalog_refresh import CatalogRefresh
from psych_sidecar.mcp.input_rounds import HeldCalls
from psych_sidecar.mcp.oauth.grants import GrantAuth
from psych_sidecar.mcp.result_parts import tool_result
from psych_sidecar.mcp.session_state import SessionState
from psych_sidecar.mcp.session_types import CatalogUnavailable, Listing, SessionTimings
from psych_sidecar.mcp.stdio import LineTooLong
from psych_sidecar.mcp.tool_calls import ToolCalls
from psych_sidecar.mcp.transport import open_transport
from psych_sidecar.telemetry import logs, tracing

if TYPE_CHECKING:
    from psych_sidecar.mcp.oauth.grants import TokenKeeper

log = logging.getLogger(__name__)

# How the sidecar introduces itself to every server. Of the client capabilities it declares
# elicitation alone, form and URL mode: a server's question goes to the host, whose user
# answers it (ContinueToolCall). No roots, no sampling.
CLIENT_INFO = types.Implementation(name="psych-sidecar", version=__version__)
# How long a failed attempt waits for its stdio server's stderr to end (it has exited, or been
# killed, by then; a child of it may hold the pipe open), to quote the line naming its error.
STDERR_END_WAIT_SECONDS = 1.0


class ConnectionSession:
    """The owner of one connection's session. `run` is the owner task; `calls` and `catalog`
    are what request handlers and the sweep call into, `state` what everyone reads."""

    def __init__(
        self,
        *,
        stored: StoredConnection,
        commands: Mapping[str, StdioCommand],
        timings: SessionTimings,
        write_catalog: Callable[[Listing], Awaitable[CatalogWrite | None]],
        validators: SchemaValidators,
        keeper: Callable[[Scrubber], TokenKeeper] | None = None,
        max_line_bytes: int,
        convert_result: Callable[[types.CallToolResult], McpToolResult] | None = None,
    ) -> None:
        """`max_line_bytes`: the longest line a stdio server may send; `convert_result` makes
        a result what the log keeps (see `ToolCalls`; None: `result_parts.tool_result`)."""
        self.state = SessionState(stored, keeper)
        self.catalog = CatalogRefresh(self.state, timings, write_catalog)
        self.calls = ToolCalls(
            state=self.state,
            validators=validators,
            output_schema=self.catalog.output_schema,
            connect_timeout=timings.connect_timeout,
            convert=convert_result or tool_result,
            held=HeldCalls(
                answer_timeout=timings.input_wait,
                max_held=timings.max_held_calls,
                protocol_version="",
            ),
        )
        self._commands = commands
        self._timings = timings
        self._max_line_bytes = max_line_bytes
        self._wake = anyio.Event()
        # Why the transport ended, when it said so (a stdio line over the limit).
        self._close_reason = ""
        # What the current attempt is doing, for the warning when it fails.
        self._doing = "connecting"
        # Whether the current attempt got as far as CONNECTED.
        self._connected = False

    def stop(self) -> None:
        self.state.stopping.set()

    def reconnect_now(self) -> None:
        """Skip the rest of the backoff delay."""
        self._wake.set()

    async def run(self) -> None:
        state = self.state
        delay = self._timings.reconnect_min
        tenant, name = state.key
        # This task's log lines name their connection, not the call that started it, and
        # its spans (refreshes) start traces of their own. Its context is its own: no reset.
        logs.bind_only(tenant=tenant, connection=name)
        tracing.new_root()
        while not state.stopping.is_set():
            # A server that was lost stays UNREACHABLE while it is retried: CONNECTING is
            # only the first attempt, so the state does not flap with every retry.
            if state.status.state not in (
                ConnectionState.UNREACHABLE,
                ConnectionState.AUTHORIZATION_REQUIRED,
            ):
                state.set_status(ConnectionState.CONNECTING)
            try:
                await self._connect_and_serve()
            except Exception as error:
                if (reason := state.authorization_required()) is not None:
                    # Nothing changes until someone signs in (here or on another sidecar,
                    # which the keeper reads at the next attempt): no backoff ramp, the
                    # longest delay; a sign-in here wakes it at once.
                    state.set_authorization_required(reason)
                    state.finish_attempt()
                    delay = self._timings.reconnect_max
                    await self._pause(delay)
                    continue
                detail = state.describe(error)
                if not self._connected and (
                    line := await state.stderr.opening_line(STDERR_END_WAIT_SECONDS)
                ):
                    # A stdio server that died as it started: what it said about it.
                    detail = f"{detail}; stderr: {line}"
                # Each new failure is a warning; the same one again, retry after retry, is not.
                repeated = (
                    state.status.state is ConnectionState.UNREACHABLE
                    and state.status.last_error == detail
                )
                log.log(
                    logging.DEBUG if repeated else logging.WARNING,
                    "MCP connection %s/%s failed while %s: %s",
                    tenant,
                    name,
                    self._doing,
                    detail,
                )
                state.set_status(ConnectionState.UNREACHABLE, detail)
                state.finish_attempt()
            else:
                if state.stopping.is_set():
                    break
                delay = self._timings.reconnect_min
                if (reason := state.authorization_required()) is not None:
                    state.set_authorization_required(reason)
                    delay = self._timings.reconnect_max
                    await self._pause(delay)
                    continue
                state.set_status(
                    ConnectionState.UNREACHABLE, self._close_reason or "the connection closed"
                )
            await self._pause(delay)
            delay = min(delay * 2, self._timings.reconnect_max)
        state.end_attempts()

    async def _pause(self, delay: float) -> None:
        """Wait about `delay` before the next attempt, or until woken or stopped."""
        # Jitter keeps many sidecars from reconnecting to one server in lockstep.
        with anyio.move_on_after(delay * random.uniform(0.8, 1.2)):
            async with anyio.create_task_group() as group:
                group.start_soon(_set_when, self.state.stopping, group.cancel_scope)
                group.start_soon(_set_when, self._wake, group.cancel_scope)
        self._wake = anyio.Event()

    async def _connect_and_serve(self) -> None:
        state = self.state
        closed = anyio.Event()
        self._close_reason = ""
        self._doing = "connecting"
        self._connected = False
        state.new_attempt()
        state.stderr.forget_opening()
        self.catalog.new_session()
        auth = None
        if state.keeper is not None:
            self._doing = "getting an access token"
            # No token, no attempt: a connection nobody signed in to is not a server outage.
            await state.keeper.access_token()
            auth = GrantAuth(state.keeper)
        transport = open_transport(
            state.stored.connection,
            self._commands,
            closed,
            state.stderr,
            state.refusals,
            auth,
            max_line_bytes=self._max_line_bytes,
        )
        client = Client(
            transport,
            mode="auto",
            cache=None,
            message_handler=self._on_message,
            client_info=CLIENT_INFO,
            # Declares elicitation (form and URL); a 2025-11-25 server's question is held
            # for the host. A 2026-07-28 one's comes in its result (`ToolCalls`).
            elicitation_callback=self.calls.held.on_elicitation,
        )
        deadline = anyio.current_time() + self._timings.connect_timeout
        try:
            with anyio.CancelScope(deadline=deadline) as connecting:
                self._doing = "connecting (initialize)"
                async with client, anyio.create_task_group() as group:
                    self._doing = "listing its tools"
                    leave_results_to_the_sidecar(client.session)
                    assume_complete_tool_results(client.session)
                    # Subscribe before the first listing, so no change between them is lost.
                    await group.start(self.catalog.listen, client)
                    self.calls.held.serve_in(group, client.session.protocol_version or "")
                    state.client = client
                    # Sync on connect: a notification sent during initialisation can be lost.
                    await self.catalog.refresh_with(client, "connect")
                    connecting.deadline = math.inf
                    state.set_status(ConnectionState.CONNECTED)
                    self._connected = True
                    state.finish_attempt()
                    self._doing = "connected, serving calls"
                    group.start_soon(self.catalog.refresh_on_change)
                    group.start_soon(self.catalog.refresh_when_stale)
                    await _first_of(state.stopping, closed, state.broken)
                    # No new call may start on a session that is going away.
                    state.client = None
                    group.cancel_scope.cancel()
        finally:
            state.client = None
            self.calls.held.serve_in(None)
        if connecting.cancelled_caught:
            raise TimeoutError
        if state.broken.is_set() and not closed.is_set() and not state.stopping.is_set():
            raise CatalogUnavailable(state.status.last_error or "the session broke")

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.catalog.notice_change()
        elif isinstance(message, LineTooLong):
            # The transport ends after it: the reason the connection closed.
            self._close_reason = self.state.describe(message)
            log.warning("MCP connection %s/%s: %s", *self.state.key, self._close_reason)
        elif isinstance(message, Exception):
            log.info(
                "MCP connection %s/%s transport error: %s",
                *self.state.key,
                self.state.describe(message),
            )


def leave_results_to_the_sidecar(session: ClientSession) -> None:
    """Switch off the SDK's own check of a result against the tool's output schema. It raises
    RuntimeError for a result that breaks the schema, lacks structuredContent or whose schema
    has a remote `$ref` (a bug's path: "failed inside the sidecar", with a traceback), and
    re-lists the tools, whole, for a tool it has not seen listed. The sidecar judges results
    itself (`ToolCalls._judged`), after the result is converted for the log.

    Why a patch: the SDK (mcp 2.3) offers no way to turn the check off. `ClientSession.call_tool`
    (and `Client.call_tool`, for an extension's claimed result) call `validate_tool_result`
    for every result that is not an error; neither `Client` nor `ClientSession` takes an
    option for it, and the only state it reads (`_tool_output_schemas`) is private and filled
    by every listing. tests/test_sdk_contract.py fails when the method or its call sites
    change, so the patch is revisited with the SDK."""

    async def judged_by_the_sidecar(name: str, result: types.CallToolResult) -> None:
        return None

    session.validate_tool_result = judged_by_the_sidecar  # type: ignore[method-assign]


def assume_complete_tool_results(session: ClientSession) -> None:
    """A 2026-07-28 tools/call result without `resultType` is complete: the client MUST assume
    so (multi-round-trip requests, SEP-2322), and the result type's own default says the same.
    But mcp 2.3 checks a result against the revision's wire schema first, where the field is
    required, and refuses it (pydantic.ValidationError: every call to such a server failed).
    So a tools/call result the session's dispatcher receives without one is given
    `"resultType": "complete"` before the SDK looks at it.

    Why a patch: the check (`send_request`, `_methods.validate_server_result`) takes no
    option, and the raw result passes nowhere else first; tests/test_sdk_contract.py fails
    when the dispatcher's method or its call changes."""
    # The one place the raw result passes before the SDK's check.
    dispatcher = session._dispatcher
    send = dispatcher.send_raw_request

    async def completed(method: str, params: Any, *args: Any, **kwargs: Any) -> Any:
        raw = await send(method, params, *args, **kwargs)
        if (
            method == "tools/call"
            and isinstance(raw, dict)
            and "resultType" not in raw
            and session.protocol_version in STATELESS_REVISIONS
        ):
            raw = {**raw, "resultType": "complete"}
        return raw

    dispatcher.send_raw_request = completed  # type: ignore[method-assign]


async def _set_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _first_of(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as group:
        for event in events:
            group.start_soon(_set_when, event, group.cancel_scope)

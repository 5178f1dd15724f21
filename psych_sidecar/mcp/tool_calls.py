"""One connection's tool calls: tools/call on the live session under a deadline, the result
converted for the log and judged against the tool's output schema, and every failure told to
the model as what it is (a timeout, a closed connection, the server's error, a bug here).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import anyio
import anyio.to_thread
import httpx2
import mcp_types as types
import pydantic
from mcp import Client, MCPError

from psych_sidecar.domain.calls import SchemaValidators
from psych_sidecar.domain.catalog import (
    STATELESS_REVISIONS,
    AuthorizationReason,
    ConnectionState,
    InputAnswer,
    InputAsked,
    McpToolResult,
    ToolCallFailed,
    authorization_line,
)
from psych_sidecar.mcp.input_rounds import HeldCalls, Unanswerable, asked_of, input_responses
from psych_sidecar.mcp.result_parts import (
    output_schema_problem,
    schema_broken_result,
    small_result,
)
from psych_sidecar.mcp.session_state import SessionState, mcp_error
from psych_sidecar.mcp.stdio import release_large_result
from psych_sidecar.telemetry import metrics, tracing

log = logging.getLogger(__name__)

# How a call fails when the server or the connection does: each is told to the model as what
# it is. Anything else raised during a call is a bug, and is logged as one.
_EXPECTED_CALL_FAILURES = (
    MCPError,
    TimeoutError,
    OSError,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    httpx2.TransportError,
    httpx2.HTTPStatusError,
    # A result that is not a CallToolResult: the server's garbage, not the sidecar's bug.
    pydantic.ValidationError,
)


def expected_failure(error: BaseException) -> bool:
    """Whether a failure is the server's or the connection's, not a bug (`_expected`)."""
    return _expected(error)


def _expected(error: BaseException) -> bool:
    """Whether a call's failure is the server's or the connection's (every leaf of a group)."""
    if isinstance(error, BaseExceptionGroup):
        return all(_expected(leaf) for leaf in error.exceptions)
    return isinstance(error, _EXPECTED_CALL_FAILURES)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class ToolCalls:
    """Calls into one connection's live session (`state.client`). `output_schema` gives a
    tool's output schema as last listed; `convert` makes a result what the log keeps
    (`result_parts.tool_result`; a test passes one that fails, standing in for a bug).
    A call whose server asks for input first ends as an `InputAsked` (`input_rounds.py`);
    `call_tool` with `asked` goes on with the answers. `held` holds a 2025-11-25 session's
    calls."""

    state: SessionState
    # Results are judged against their tool's output schema here, not by the SDK.
    validators: SchemaValidators
    output_schema: Callable[[str], bytes]
    connect_timeout: float
    convert: Callable[[types.CallToolResult], McpToolResult]
    held: HeldCalls

    async def call_tool(
        self,
        tool: str,
        arguments: Mapping[str, object],
        timeout_seconds: float,
        *,
        asked: InputAsked | None = None,
        answers: Sequence[InputAnswer] = (),
    ) -> McpToolResult | InputAsked:
        """The call's result, or the server's questions; with `asked`, the call that asked
        them continued with `answers`."""
        server = self.state.stored.connection.name
        started = time.perf_counter()
        outcome = "refused"
        with tracing.span("mcp.call_tool") as span:
            if span is not None:
                span.set_attributes({"mcp.server": server, "mcp.tool": tool})
            try:
                result, outcome = await self._call_tool(
                    tool, arguments, timeout_seconds, _Leg(asked, tuple(answers))
                )
            except ToolCallFailed as error:
                outcome = error.outcome if isinstance(error, _CallFailed) else "refused"
                raise
            else:
                return result
            finally:
                metrics.record_tool_call(server, outcome, time.perf_counter() - started)
                if span is not None:
                    span.set_attribute("mcp.outcome", outcome)

    async def _call_tool(
        self, tool: str, arguments: Mapping[str, object], timeout_seconds: float, leg: _Leg
    ) -> tuple[McpToolResult | InputAsked, str]:
        """The result, and the call's metric outcome."""
        state = self.state
        if state.status.state is ConnectionState.CONNECTING:
            await state.wait_attempt(
                state.finished_attempts, min(timeout_seconds, self.connect_timeout)
            )
        client = state.client
        if client is None or state.status.state is not ConnectionState.CONNECTED:
            raise ToolCallFailed(state.unreachable_text(), state.status.authorization_reason)
        refusals_before = state.refusals.count
        try:
            return await self._call_connected(
                client, tool, arguments, timeout_seconds, refusals_before, leg
            )
        except ToolCallFailed:
            if (reason := state.authorization_required()) is not None:
                # The server refused the tokens and they could not be renewed: the session
                # ends, and the state says why.
                state.set_authorization_required(reason)
                state.broken.set()
                raise _CallFailed(
                    authorization_line(state.stored.connection.name, reason),
                    "refused",
                    reason,
                ) from None
            raise

    async def _call_connected(
        self,
        client: Client,
        tool: str,
        arguments: Mapping[str, object],
        timeout_seconds: float,
        refusals_before: int,
        leg: _Leg,
    ) -> tuple[McpToolResult | InputAsked, str]:
        server = self.state.stored.connection.name
        try:
            # The SDK's read timeout answers first; the scope is a backstop.
            with anyio.fail_after(timeout_seconds + 5):
                result = await self._send(client, tool, dict(arguments), timeout_seconds, leg)
            if isinstance(result, InputAsked):
                return result, "input_required"
            if self._judged_quickly(tool, result):
                return self._judged(tool, result)
            # Converting a large result (base64 decoding, JSON of tens of MB) and judging it
            # against its output schema are CPU work: off the event loop, so health checks
            # and other calls are answered meanwhile.
            judged = await anyio.to_thread.run_sync(self._judged, tool, result)
            release_large_result(result)
            return judged
        except Unanswerable as error:
            raise _unanswerable(server, tool, error) from None
        except ToolCallFailed as error:
            raise _CallFailed(
                f"The call to {tool!r} on MCP server {server!r}: {error}.", "refused"
            ) from None
        except Exception as error:
            if _expected(error):
                raise _CallFailed(
                    self._call_failure_text(tool, timeout_seconds, error, refusals_before),
                    _outcome(error),
                ) from None
            # A bug (here or in the SDK), not the server's failure: logged with its stack
            # under a correlation id; the model still gets a tool error naming that id.
            correlation_id = uuid.uuid4().hex
            log.exception(
                "unexpected error calling %r on MCP server %r, correlation id %s",
                tool,
                server,
                correlation_id,
                extra={"correlation_id": correlation_id},
            )
            raise _CallFailed(
                f"The call to {tool!r} on MCP server {server!r} failed "
                f"inside the sidecar ({type(error).__name__}); correlation id {correlation_id}.",
                "refused",
            ) from None

    def judge(self, tool: str, result: types.CallToolResult) -> McpToolResult:
        """A result had otherwise (a task's): converted for the log and judged against the
        tool's output schema, as a call's."""
        return self._judged(tool, result)[0]

    def asked(
        self, tool: str, result: types.InputRequiredResult, protocol_version: str
    ) -> InputAsked:
        """A server's questions had otherwise (answering a call offered as a task): as a
        call's, or the tool error saying this client cannot answer them."""
        try:
            return asked_of(result, protocol_version)
        except Unanswerable as error:
            raise _unanswerable(self.state.stored.connection.name, tool, error) from None

    async def _send(
        self,
        client: Client,
        tool: str,
        arguments: dict[str, object],
        timeout_seconds: float,
        leg: _Leg,
    ) -> types.CallToolResult | InputAsked:
        """One leg of the call: the first, or one continuing with answers. A 2026-07-28
        server's input_required result comes back as an InputAsked (the SDK is not let
        answer it); a 2025-11-25 session's calls are held (`HeldCalls`) so that a question
        can wait for the host's user."""
        asked = leg.asked
        version = client.session.protocol_version or ""
        if asked is not None and not asked.stateless:
            return await self.held.answer(asked.held, leg.answers, timeout_seconds)
        if asked is None and version not in STATELESS_REVISIONS:
            return await self.held.start(
                lambda: client.call_tool(tool, arguments, read_timeout_seconds=None),
                timeout_seconds,
            )
        result = await client.session.call_tool(
            tool,
            arguments,
            read_timeout_seconds=timeout_seconds,
            input_responses=None if asked is None else input_responses(asked, leg.answers),
            request_state=None if asked is None else asked.request_state,
            allow_input_required=True,
        )
        if isinstance(result, types.InputRequiredResult):
            return asked_of(result, version)
        return result

    def _judged_quickly(self, tool: str, result: types.CallToolResult) -> bool:
        """Whether converting and judging the result is cheap enough for the event loop: a
        small result, and no output schema check that is not (`SchemaValidators.quick`)."""
        if not small_result(result):
            return False
        schema = self.output_schema(tool)
        structured = result.structured_content
        return (
            not schema
            or structured is None
            or bool(result.is_error)
            or self.validators.quick(schema, structured)
        )

    def _judged(self, tool: str, result: types.CallToolResult) -> tuple[McpToolResult, str]:
        """The result as the log keeps it, and its metric outcome. One that breaks the tool's
        own output schema is the server's fault: a tool error the model can act on, with all
        the server sent after it, a warning (no traceback: nothing failed here) and the
        outcome server_error."""
        schema = self.output_schema(tool)
        problem = output_schema_problem(self.validators, schema, result)
        if not problem:
            return self.convert(result), "tool_error" if result.is_error else "ok"
        problem = self.state.scrub(problem)
        server = self.state.stored.connection.name
        log.warning(
            "MCP connection %s/%s: the result of %r does not match its declared output schema: %s",
            *self.state.key,
            tool,
            problem,
        )
        message = (
            f"MCP server {server!r} ran {tool!r}, but the server's result does not match its "
            f"declared output schema: {problem}. What the server returned follows."
        )
        return schema_broken_result(result, message), "server_error"

    def _call_failure_text(
        self, tool: str, timeout: float, error: BaseException, refusals_before: int
    ) -> str:
        state = self.state
        server = state.stored.connection.name
        if refusal := state.refusal(error, refusals_before):
            return state.scrub(f"MCP server {server!r} refused the call to {tool!r}: {refusal}")
        failed = mcp_error(error)
        if isinstance(error, TimeoutError) or (
            failed is not None and failed.code == types.REQUEST_TIMEOUT
        ):
            return f"MCP server {server!r} did not answer {tool!r} within {timeout:g} seconds."
        if failed is not None and failed.code == types.CONNECTION_CLOSED:
            # Visible at once, not only when the owner has wound the session down.
            if state.status.state is ConnectionState.CONNECTED:
                state.set_status(ConnectionState.UNREACHABLE, "the connection closed")
            state.broken.set()
            return (
                f"The connection to MCP server {server!r} closed during the call to {tool!r}; "
                "the server is unreachable until it comes back."
            )
        if failed is not None:
            return state.scrub(
                f"MCP server {server!r} answered the call to {tool!r} with error "
                f"{failed.code}: {failed.message}"
            )
        return f"The call to {tool!r} on MCP server {server!r} failed: {state.describe(error)}"


@dataclass(frozen=True, slots=True)
class _Leg:
    """Which leg of a call: the first (`asked` None), or one answering `asked`."""

    asked: InputAsked | None
    answers: tuple[InputAnswer, ...]


class _CallFailed(ToolCallFailed):
    """A call the server was asked and did not answer with a result."""

    def __init__(
        self, message: str, outcome: str, authorization: AuthorizationReason | None = None
    ) -> None:
        super().__init__(message, authorization)
        self.outcome = outcome


def _unanswerable(server: str, tool: str, error: Unanswerable) -> _CallFailed:
    """A server's questions this client cannot answer: a tool error the model is told."""
    return _CallFailed(
        f"MCP server {server!r} asked for input to {tool!r} that this client cannot give: {error}.",
        "tool_error",
    )


def _outcome(error: BaseException) -> str:
    """A failed call's metric outcome: timeout, refused (the connection closed),
    server_error (the answer was not a result) or tool_error (the server answered with an
    error)."""
    failed = mcp_error(error)
    if isinstance(error, TimeoutError) or (
        failed is not None and failed.code == types.REQUEST_TIMEOUT
    ):
        return "timeout"
    if failed is not None and failed.code == types.CONNECTION_CLOSED:
        return "refused"
    if failed is None and isinstance(error, pydantic.ValidationError):
        return "server_error"  # not a CallToolResult at all
    return "tool_error"

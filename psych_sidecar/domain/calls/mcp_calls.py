"""The one path to an MCP tool, whichever way the call came (a surface tool, a facade, a meta
tool, CallDeferredTool).

A call is checked against the Run's permitted set as of *now* (the current catalogue, the
connection's allow/deny, the Spec's grants, the Run's restrictions) whatever surface the model
saw, so a permission change or a removed tool takes effect on the next call. What a model can
get wrong — an unknown server, an unknown or unpermitted tool, arguments its input schema
refuses, an unreachable or timed-out server — comes back as a tool result with is_error set.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psych_sidecar.domain.calls.outcomes import Asking, CallResult, ToolResult
from psych_sidecar.domain.calls.validation import SchemaValidators
from psych_sidecar.domain.catalog import (
    AuthorizationReason,
    ConnectionState,
    InputAnswer,
    InputAsked,
    InputWait,
    McpToolRequest,
    McpToolResult,
    ToolCallFailed,
    ToolRunner,
)
from psych_sidecar.domain.runlog import OffLoop
from psych_sidecar.domain.surface import ExposedTool, ResolvedTurn, naming

# How many schema violations a validation error lists.
MAX_VALIDATION_ERRORS = 5

TaskStart = Callable[[McpToolRequest, float], Awaitable["McpToolResult | ToolResult | InputAsked"]]
"""Starts a call that may run as a task (`tasks.ToolTasks.start`, bound to the call): given the
call and its timeout, the server's result when it answered at once (or its questions, when it
asked for input first), or the recorded-to-be result saying the task started."""


@dataclass(frozen=True, slots=True)
class RoutedCall:
    """A model's call of a tool that takes any JSON object (an MCP tool, a facade, a meta
    tool): what the Run may reach, the tool its name routed to, the arguments, and the
    timeout of the MCP tool it reaches."""

    resolved: ResolvedTurn
    route: ExposedTool
    arguments: Mapping[str, Any]
    timeout_seconds: float
    # How the call may start as a task (None: it runs as any other).
    start: TaskStart | None = None


class McpCalls:
    def __init__(self, runner: ToolRunner, cpu: OffLoop) -> None:
        self._runner = runner
        # Schema validation is CPU work: on the CPU threads, never the storage ones.
        self._cpu = cpu
        self._validators = SchemaValidators()

    async def direct(self, call: RoutedCall) -> CallResult:
        """An MCP tool exposed on the surface under its own name."""
        route = call.route
        return await self.call(
            call.resolved,
            route.server,
            route.tool,
            call.arguments,
            call.timeout_seconds,
            start=call.start,
        )

    async def call(
        self,
        resolved: ResolvedTurn,
        server: str,
        tool: str,
        arguments: Any,
        timeout_seconds: float,
        *,
        start: TaskStart | None = None,
    ) -> CallResult:
        tools = resolved.permitted.get(server)
        if tools is None:
            return unknown_server(resolved, server)
        found = tools.get(tool)
        if found is None:
            return not_found(resolved, server, tool)
        if not isinstance(arguments, dict):
            return ToolResult.error(
                f"The arguments of {server}/{tool} must be a JSON object.", server, tool
            )
        schema = found.input_schema_json
        judged = given_arguments(arguments)
        if self._validators.quick(schema, judged):
            problems = self._validators.errors(schema, judged)
        else:
            problems = await self._cpu(self._validators.errors, schema, judged)
        if problems:
            shown = problems[:MAX_VALIDATION_ERRORS]
            more = len(problems) - len(shown)
            message = (
                f"Invalid arguments for {server}/{tool}; nothing was run. "
                + "; ".join(shown)
                + (f"; and {more} more" if more else "")
                + f". Read its input schema with {naming.DESCRIBE_TOOL}."
            )
            return ToolResult.error(message, server, tool)
        request = McpToolRequest(
            tenant=resolved.snapshot.servers[server].connection.tenant,
            server=server,
            tool=tool,
            arguments=arguments,
        )
        try:
            if start is None:
                result = await self._runner.call_tool(request, timeout_seconds)
            else:
                answer = await start(request, timeout_seconds)
                if isinstance(answer, ToolResult):
                    return answer  # started as a task
                result = answer
        except ToolCallFailed as failure:
            return _not_answered(failure, server, tool)
        return _answered(result, request)

    async def continue_call(
        self,
        resolved: ResolvedTurn,
        wait: InputWait,
        answers: Sequence[InputAnswer],
        timeout_seconds: float,
    ) -> CallResult:
        """The waiting call continued with the user's answers, its tool re-checked against
        the Run's permitted set as of now (a grant withdrawn meanwhile refuses it)."""
        server, tool = wait.server, wait.tool
        tools = resolved.permitted.get(server)
        if tools is None:
            return unknown_server(resolved, server)
        if tool not in tools:
            return not_found(resolved, server, tool)
        request = McpToolRequest(
            tenant=resolved.snapshot.servers[server].connection.tenant,
            server=server,
            tool=tool,
            arguments=json.loads(wait.arguments_json),
        )
        try:
            result = await self._runner.continue_tool(
                request, asked=wait.asked, answers=answers, timeout_seconds=timeout_seconds
            )
        except ToolCallFailed as failure:
            return _not_answered(failure, server, tool)
        return _answered(result, request)

    async def unreachable(
        self, resolved: ResolvedTurn, wait: InputWait, timeout_seconds: float
    ) -> str | None:
        """Why the waiting call's server cannot be reached just now through this sidecar's
        session, after waiting within the timeout; None when the call may go on."""
        if wait.server not in resolved.permitted:
            return None  # the continuation refuses it
        tenant = resolved.snapshot.servers[wait.server].connection.tenant
        return await self._runner.unreachable(tenant, wait.server, timeout_seconds)


def given_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments the sidecar's own check judges: a top-level `null` reads as not given.

    The MCP server is the judge of its inputs (2026-07-28, tools: servers MUST validate all
    tool inputs, and an invalid input is a tool execution error they report). The transport
    expects `null` for a parameter in a call and only omits its header (Streamable HTTP,
    custom headers: "Parameter value is null: client MUST omit the header"). So the sidecar's
    check, which spares the model a round trip for what is surely wrong, leaves a `null` to
    the server; the arguments are sent as given."""
    if not any(value is None for value in arguments.values()):
        return arguments
    return {key: value for key, value in arguments.items() if value is not None}


def unknown_server(resolved: ResolvedTurn, server: object) -> ToolResult:
    known = ", ".join(sorted(resolved.permitted)) or "none"
    return ToolResult.error(f"There is no MCP server {server!r}. Servers: {known}.")


def not_found(resolved: ResolvedTurn, server: str, tool: object) -> ToolResult:
    """A tool the Run may not reach on a server it may: if the server never listed its tools,
    the model is told why (unreachable, needing sign-in), not that the tool does not exist."""
    status = resolved.snapshot.servers[server].status
    if status.catalog_version:
        return refused(server, tool)
    if status.state is ConnectionState.UNREACHABLE:
        since = status.state_time.strftime("%Y-%m-%dT%H:%M:%SZ")
        reason = f": {status.last_error}" if status.last_error else ""
        why = f"it is unreachable since {since}{reason}. Its tools can be called once it connects"
    elif status.state is ConnectionState.AUTHORIZATION_REQUIRED:
        why = authorization_needed(status.authorization_reason)
    else:
        why = "it is still connecting; try again shortly"
    return ToolResult.error(
        f"MCP server {server!r} has not listed its tools: {why}.",
        server,
        tool if isinstance(tool, str) else "",
        authorization=status.authorization_reason,
    )


def authorization_needed(reason: AuthorizationReason | None) -> str:
    if reason is AuthorizationReason.NEVER_SIGNED_IN:
        return "nobody has signed in to it yet. Its tools can be called once the user does"
    if reason is AuthorizationReason.CREDENTIALS_REFUSED:
        return (
            "its server refused the sidecar's credentials. Its tools can be called once an "
            "operator fixes them"
        )
    return "it needs the user to sign in again. Its tools can be called once they do"


def refused(server: str, tool: object) -> ToolResult:
    return ToolResult.error(
        f"There is no tool {tool!r} on {server} that you may use. List the ones you may use "
        f"with {naming.LIST_TOOLS}.",
        server,
        tool if isinstance(tool, str) else "",
    )


def _not_answered(failure: ToolCallFailed, server: str, tool: str) -> ToolResult:
    """A call the server did not answer, as the model's tool error."""
    return ToolResult.error(
        f"{server}/{tool} did not answer: {failure}",
        server,
        tool,
        authorization=failure.authorization,
    )


def _answered(result: McpToolResult | InputAsked, request: McpToolRequest) -> CallResult:
    """The server's answer: its result, or the questions it asks before it can give one."""
    if isinstance(result, InputAsked):
        return Asking(result, request.server, request.tool, request.arguments)
    return ToolResult(
        result.is_error, result.result_json, result.content, request.server, request.tool
    )

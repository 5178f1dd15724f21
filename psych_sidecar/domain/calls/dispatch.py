"""DispatchToolCall: a model's tool call, as emitted, routed to whoever runs it.

The one router: a name resolves to an exposed tool through the Run's current surface
(``ToolExecutor.route``: the surface's names, and names the model kept from an older one),
and the tool's kind picks its handler from one table — the MCP kinds (direct, facade,
search pair, meta tools) run by ``ToolExecutor``, the sidecar's own tools here. A name with
no route belongs to the host.

What the model can get wrong (arguments that are not JSON, miss a field or have a wrong type,
a bad grep pattern, an unknown skill) comes back as a tool result with is_error set, and is
appended to the log like any result. A handle that does not resolve in this Run is not a
model error but a protocol violation: INVALID_DEFERRED_HANDLE, and nothing is appended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from psych_sidecar.domain.calls.executor import (
    KindHandler,
    PendingResult,
    ToolExecutor,
    ToolOutcome,
    parse_arguments,
    tool_error,
)
from psych_sidecar.domain.calls.tool_output import ToolOutputReader
from psych_sidecar.domain.canonical import bounded_loads
from psych_sidecar.domain.errors import Reason, SidecarError, field_invalid, field_required
from psych_sidecar.domain.runlog import (
    MAX_IDENTIFIER_LENGTH,
    ContentPart,
    PartKind,
    Run,
    RunBlocking,
    Spec,
    ToolCall,
    binary_marker,
)
from psych_sidecar.domain.surface import (
    MODEL_DEFAULT_LIMIT_CHARS,
    MODEL_MAX_BINARY_BYTES,
    MODEL_MAX_LIMIT_CHARS,
    ExposedKind,
    ExposedTool,
    ResolvedTurn,
    RunContext,
    TurnResolver,
    mcp_result_json,
)


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """A handler's answer: what the model sees, and the MCP-shaped result JSON of it."""

    is_error: bool
    content: tuple[ContentPart, ...]
    result_json: bytes

    @classmethod
    def of(cls, content: tuple[ContentPart, ...], is_error: bool = False) -> ToolExecution:
        return cls(is_error, content, mcp_result_json(content, is_error))

    @classmethod
    def error(cls, message: str) -> ToolExecution:
        return cls.of((ContentPart.text(message),), is_error=True)


OwnHandler = Callable[[RunContext, ToolCall], ToolExecution]
"""Runs one of the sidecar's own tools (synchronous: it reads the log)."""

Route = Callable[[RunContext, ResolvedTurn, ExposedTool, ToolCall], Awaitable[ToolOutcome]]


class _ArgumentError(Exception):
    pass


def _arguments(call: ToolCall, fields: dict[str, type], required: set[str]) -> dict[str, Any]:
    """Arguments as the schema says, or an _ArgumentError naming what is wrong."""
    try:
        value = bounded_loads(call.arguments_json or "{}")
    except ValueError as error:
        raise _ArgumentError(f"the arguments are not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise _ArgumentError("the arguments must be a JSON object")
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise _ArgumentError(f"unknown argument {unknown[0]!r}")
    for name in sorted(required):
        if name not in value:
            raise _ArgumentError(f"{name!r} is required")
    for name, kind in fields.items():
        if name not in value:
            continue
        item = value[name]
        if kind is int and (isinstance(item, bool) or not isinstance(item, int)):
            raise _ArgumentError(f"{name!r} must be an integer")
        if kind is int and item < 0:
            raise _ArgumentError(f"{name!r} must not be negative")
        if kind is str and not isinstance(item, str):
            raise _ArgumentError(f"{name!r} must be a string")
    return value


class DispatchService:
    def __init__(
        self,
        reader: ToolOutputReader,
        resolver: TurnResolver,
        executor: ToolExecutor,
        blocking: RunBlocking,
    ) -> None:
        self._reader = reader
        self._resolver = resolver
        self._executor = executor
        self._blocking = blocking
        # The dispatch table: every kind of tool the sidecar runs, and who runs it.
        self._table: dict[ExposedKind, Route] = {
            kind: self._mcp_route(handler) for kind, handler in executor.kind_handlers().items()
        }
        self._table[ExposedKind.READ_TOOL_OUTPUT] = self._own_route(
            lambda context, call: self._read_tool_output(context.run, call)
        )
        self._table[ExposedKind.LOAD_SKILL] = self._own_route(
            lambda context, call: _load_skill(context.spec, call)
        )

    async def dispatch(self, run_id: str, call: ToolCall) -> ToolOutcome | None:
        """Run and record the call when the sidecar owns its tool; None when the host does."""
        if not call.call_id:
            raise field_required("call.call_id")
        if not call.name:
            raise field_required("call.name")
        if "\x00" in call.call_id or len(call.call_id) > MAX_IDENTIFIER_LENGTH:
            raise field_invalid(
                "call.call_id", f"at most {MAX_IDENTIFIER_LENGTH} characters, no NUL"
            )
        context, resolved = await self._blocking(self._resolver.resolved, run_id)
        route = self._executor.route(resolved, call.name)
        if route is None:
            return None
        return await self._table[route.kind](context, resolved, route, call)

    def _mcp_route(self, handler: KindHandler) -> Route:
        async def run(
            context: RunContext, resolved: ResolvedTurn, route: ExposedTool, call: ToolCall
        ) -> ToolOutcome:
            async def produce() -> PendingResult:
                arguments, problem = parse_arguments(call.arguments_json)
                if arguments is None:
                    result = tool_error(problem, route.server, route.tool or route.name)
                else:
                    timeout = self._executor.default_timeout
                    result = await handler(context, resolved, route, arguments, timeout)
                if not result.server and not result.tool:
                    # A result not tied to one MCP tool is recorded under the tool the model
                    # called.
                    result = dataclasses.replace(result, server=route.server, tool=route.name)
                return result

            # Once per (Run, assistant step, call id): a retry gets the recorded result.
            return await self._executor.once(context, call.call_id, produce)

        return run

    def _own_route(self, handler: OwnHandler) -> Route:
        async def run(
            context: RunContext, resolved: ResolvedTurn, route: ExposedTool, call: ToolCall
        ) -> ToolOutcome:
            async def produce() -> PendingResult:
                execution: ToolExecution = await self._blocking(handler, context, call)
                return PendingResult(
                    execution.is_error, execution.result_json, execution.content, "", call.name
                )

            # Once per (Run, assistant step, call id), like the MCP kinds.
            return await self._executor.once(context, call.call_id, produce)

        return run

    def _read_tool_output(self, run: Run, call: ToolCall) -> ToolExecution:
        try:
            arguments = _arguments(
                call, {"handle": str, "offset": int, "limit": int, "grep": str}, {"handle"}
            )
        except _ArgumentError as error:
            return ToolExecution.error(
                f'read_tool_output: {error}. Expected {{"handle": string, "offset": '
                'integer >= 0, "limit": integer >= 0, "grep": string}; only handle is '
                "required."
            )
        offset = arguments.get("offset", 0)
        limit = min(arguments.get("limit") or MODEL_DEFAULT_LIMIT_CHARS, MODEL_MAX_LIMIT_CHARS)
        grep = arguments.get("grep", "")
        handle = arguments["handle"]
        try:
            result = self._reader.read_in(
                run, handle, offset, limit, grep, 4 * MODEL_MAX_LIMIT_CHARS
            )
        except SidecarError as error:
            if error.reason in (Reason.PATTERN_INVALID, Reason.PATTERN_TOO_COMPLEX):
                return ToolExecution.error(f"read_tool_output: grep {error.metadata['detail']}")
            raise
        if result.binary:
            return self._binary_for_model(run, handle, result.total_length, result.mime_type)
        end = result.next_offset
        grep_found_nothing = grep and not result.matches and end >= result.total_length
        if grep_found_nothing or (not grep and offset >= result.total_length):
            # The spec's boundary behaviour: past the end, or no match, is an empty result.
            return ToolExecution.of(())
        if grep:
            lines = [f"{m.line_number}: {m.line}" for m in result.matches]
            if not lines:
                # The bounded scan stopped before the end: say where to go on.
                lines.append(f"[No line matches from offset {offset} to {end}.]")
            if end < result.total_length:
                lines.append(f"[More lines may match: continue with offset {end}.]")
            return ToolExecution.of((ContentPart.text("\n".join(lines)),))
        text = result.text
        if end < result.total_length:
            text += (
                f"\n[Characters {offset} to {end} of {result.total_length}: continue with "
                f"offset {end}.]"
            )
        return ToolExecution.of((ContentPart.text(text),))

    def _binary_for_model(self, run: Run, handle: str, total: int, mime_type: str) -> ToolExecution:
        """A model cannot use a byte range: it gets the whole content (an image it can see)
        when small enough, with a line saying what it is."""
        marker = binary_marker(mime_type, total)
        if total > MODEL_MAX_BINARY_BYTES:
            note = f"{marker} Too large to show (over {MODEL_MAX_BINARY_BYTES} bytes)."
            return ToolExecution.of((ContentPart.text(note),))
        whole = self._reader.read_in(run, handle, 0, total, "", MODEL_MAX_BINARY_BYTES)
        note = f"{marker} offset, limit and grep do not apply to binary content."
        content = (ContentPart.text(note), ContentPart(PartKind.BINARY, whole.data, mime_type))
        return ToolExecution(False, content, mcp_result_json(content, False, handle))


def _load_skill(spec: Spec, call: ToolCall) -> ToolExecution:
    names = ", ".join(skill.name for skill in spec.skills)
    try:
        arguments = _arguments(call, {"name": str}, {"name"})
    except _ArgumentError as error:
        return ToolExecution.error(f'load_skill: {error}. Expected {{"name": string}}.')
    for skill in spec.skills:
        if skill.name == arguments["name"]:
            return ToolExecution.of((ContentPart.text(skill.body or "(This skill is empty.)"),))
    return ToolExecution.error(
        f"load_skill: no skill named {arguments['name']!r}. Skills: {names}."
    )

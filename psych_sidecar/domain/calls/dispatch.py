"""DispatchToolCall: a model's tool call, as emitted, routed to whoever runs it.

A Run's routes are a table from exposed tool name to handler, built per call from the Run and
its Spec: the sidecar's own tools now; MCP tools (direct, facade, search pair, meta tools)
are further entries added to the same table. A name with no route belongs to the host.

What the model can get wrong (arguments that are not JSON, miss a field or have a wrong type,
a bad grep pattern, an unknown skill) comes back as a tool result with is_error set, and is
appended to the log like any result. A handle that does not resolve in this Run is not a
model error but a protocol violation: INVALID_DEFERRED_HANDLE, and nothing is appended.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psych_sidecar.domain import bounded_json
from psych_sidecar.domain.calls.tool_output import ToolOutputReader
from psych_sidecar.domain.errors import Reason, SidecarError, field_invalid, field_required
from psych_sidecar.domain.prompt import SpecLookup
from psych_sidecar.domain.runlog import (
    MAX_IDENTIFIER_LENGTH,
    ContentPart,
    LogReader,
    PartKind,
    Record,
    RecordKind,
    Run,
    RunService,
    Spec,
    ToolCall,
    binary_marker,
)
from psych_sidecar.domain.surface import (
    LOAD_SKILL,
    MODEL_DEFAULT_LIMIT_CHARS,
    MODEL_MAX_BINARY_BYTES,
    MODEL_MAX_LIMIT_CHARS,
    READ_TOOL_OUTPUT,
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


Handler = Callable[[ToolCall], ToolExecution]


class ToolRouter:
    """Exposed tool name to handler, for one Run."""

    def __init__(self) -> None:
        self._routes: dict[str, Handler] = {}

    def add(self, name: str, handler: Handler) -> None:
        if name in self._routes:
            raise ValueError(f"two routes for tool {name!r}")
        self._routes[name] = handler

    def get(self, name: str) -> Handler | None:
        return self._routes.get(name)


@dataclass(frozen=True, slots=True)
class DispatchOutcome:
    """`execution` is None when the call belongs to the host; otherwise the result was
    appended at `sequence` with `handle`."""

    execution: ToolExecution | None
    sequence: int = 0
    handle: str = ""


class _ArgumentError(Exception):
    pass


def _arguments(call: ToolCall, fields: dict[str, type], required: set[str]) -> dict[str, Any]:
    """Arguments as the schema says, or an _ArgumentError naming what is wrong."""
    try:
        value = bounded_json.loads(call.arguments_json or "{}")
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
        runs: RunService,
        specs: SpecLookup,
        log: LogReader,
        reader: ToolOutputReader,
    ) -> None:
        self._runs = runs
        self._specs = specs
        self._log = log
        self._reader = reader

    def routes(self, run: Run, spec: Spec) -> ToolRouter:
        router = ToolRouter()
        router.add(READ_TOOL_OUTPUT, lambda call: self._read_tool_output(run, call))
        if spec.skills:
            router.add(LOAD_SKILL, lambda call: _load_skill(spec, call))
        return router

    def dispatch(self, run_id: str, call: ToolCall) -> DispatchOutcome:
        if not call.call_id:
            raise field_required("call.call_id")
        if not call.name:
            raise field_required("call.name")
        if "\x00" in call.call_id or len(call.call_id) > MAX_IDENTIFIER_LENGTH:
            raise field_invalid(
                "call.call_id", f"at most {MAX_IDENTIFIER_LENGTH} characters, no NUL"
            )
        run = self._runs.get(run_id)
        handler = self.routes(run, self._specs.get(run.spec_name, run.spec_version)).get(call.name)
        if handler is None:
            return DispatchOutcome(None)
        execution = handler(call)
        record = Record(
            RecordKind.TOOL_RESULT,
            content=execution.content,
            call_id=call.call_id,
            tool=call.name,
            is_error=execution.is_error,
        )
        (appended,) = self._runs.append(run_id, self._request_id(run_id, call), (record,))
        return DispatchOutcome(execution, appended.sequence, appended.handle)

    def _request_id(self, run_id: str, call: ToolCall) -> str:
        """The same call dispatched again (a retry after a lost response) appends once: the
        id names the call within the assistant message that made it."""
        step = self._log.latest_assistant_sequence(run_id)
        digest = hashlib.sha256(f"{step}\x00{call.call_id}".encode()).hexdigest()
        return f"dispatch-{digest[:48]}"

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
            if error.reason is Reason.PATTERN_INVALID:
                return ToolExecution.error(f"read_tool_output: grep {error.metadata['detail']}")
            raise
        if result.binary:
            return self._binary_for_model(run, handle, result.total_length, result.mime_type)
        end = result.next_offset
        if grep:
            lines = [f"{m.line_number}: {m.line}" for m in result.matches]
            if not lines:
                lines.append(f"[No line matches from offset {offset} on.]")
            if end < result.total_length:
                lines.append(f"[More lines may match: continue with offset {end}.]")
            return ToolExecution.of((ContentPart.text("\n".join(lines)),))
        if offset >= result.total_length:
            note = f"[Nothing at offset {offset}: the result has {result.total_length} characters.]"
            return ToolExecution.of((ContentPart.text(note),))
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

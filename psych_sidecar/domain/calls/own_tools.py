"""The sidecar's own tools, as a model calls them: read_tool_output (pages, greps and queries
of a stored result, in-process over the log), load_skill (a skill's full text) and
read_history (the records a compaction summarised, calls/history.py). Their
definitions are in domain/surface/sidecar_tools.py. Synchronous: they read the log.

What the model can get wrong (arguments that miss a field or have a wrong type, a bad grep
pattern or query, a query on content that is not JSON, an unknown skill) is a tool result
with is_error set. A handle that does not resolve in this Run is not a model error but a
protocol violation: INVALID_DEFERRED_HANDLE, raised.
"""

from __future__ import annotations

from psych_sidecar.domain.calls.arguments import ArgumentError, parse_arguments
from psych_sidecar.domain.calls.history import HistoryReader
from psych_sidecar.domain.calls.outcomes import ToolResult
from psych_sidecar.domain.calls.tool_output import ReadResult, ToolOutputReader
from psych_sidecar.domain.errors import FieldInvalid, PatternInvalid, PatternTooComplex
from psych_sidecar.domain.runlog import ContentPart, PartKind, Run, ToolCall, binary_marker
from psych_sidecar.domain.surface import (
    MODEL_DEFAULT_LIMIT_CHARS,
    MODEL_MAX_BINARY_BYTES,
    MODEL_MAX_LIMIT_CHARS,
    RunContext,
)


class OwnTools:
    def __init__(self, reader: ToolOutputReader, history: HistoryReader) -> None:
        self._reader = reader
        self._history = history

    def read_history(self, context: RunContext, call: ToolCall) -> ToolResult:
        try:
            arguments = parse_arguments(
                call.arguments_json,
                {"turn": int, "sequence": int, "grep": str, "limit": int},
            )
        except ArgumentError as error:
            return ToolResult.error(
                f'read_history: {error}. Expected {{"turn": integer >= 1, "sequence": integer '
                '>= 1, "grep": string, "limit": integer >= 0}, all optional.'
            )
        turn, sequence = arguments.get("turn"), arguments.get("sequence")
        if turn is not None and sequence is not None:
            return ToolResult.error("read_history: give turn or sequence, not both.")
        if turn == 0 or sequence == 0:
            return ToolResult.error("read_history: turn and sequence start at 1.")
        limit = min(arguments.get("limit") or MODEL_DEFAULT_LIMIT_CHARS, MODEL_MAX_LIMIT_CHARS)
        try:
            page = self._history.read(
                context.run.run_id,
                turn=turn,
                sequence=sequence,
                grep=arguments.get("grep", ""),
                limit=limit,
            )
        except (PatternInvalid, PatternTooComplex) as error:
            return ToolResult.error(f"read_history: {error.field} {error.detail}")
        if not page.text:
            if not page.next_sequence:
                # The spec's boundary behaviour: nothing there, or no match, is empty.
                return ToolResult.of(())
            text = f"[No line matches up to record {page.next_sequence - 1}.]"
        else:
            text = page.text
        if page.next_sequence:
            text += (
                f"\n[More up to record {page.span_end}: continue with "
                f"sequence={page.next_sequence}.]"
            )
        return ToolResult.of((ContentPart.text(text),))

    def read_tool_output(self, context: RunContext, call: ToolCall) -> ToolResult:
        run = context.run
        try:
            arguments = parse_arguments(
                call.arguments_json,
                {"handle": str, "offset": int, "limit": int, "grep": str, "query": str},
                {"handle"},
            )
        except ArgumentError as error:
            return ToolResult.error(
                f'read_tool_output: {error}. Expected {{"handle": string, "offset": '
                'integer >= 0, "limit": integer >= 0, "grep": string, "query": string}; only '
                "handle is required."
            )
        offset = arguments.get("offset", 0)
        limit = min(arguments.get("limit") or MODEL_DEFAULT_LIMIT_CHARS, MODEL_MAX_LIMIT_CHARS)
        grep = arguments.get("grep", "")
        query = arguments.get("query", "")
        handle = arguments["handle"]
        try:
            result = self._reader.read(
                run, handle, offset, limit, grep, 4 * MODEL_MAX_LIMIT_CHARS, query=query
            )
        except (PatternInvalid, PatternTooComplex) as error:
            return ToolResult.error(f"read_tool_output: {error.field} {error.detail}")
        except FieldInvalid as error:
            if error.field != "query":
                raise
            return ToolResult.error(f"read_tool_output: query: {error.detail}")
        if query:
            return _query_page(result, offset)
        if result.binary:
            return self._binary_for_model(run, handle, result.total_length, result.mime_type)
        end = result.next_offset
        grep_found_nothing = grep and not result.matches and end >= result.total_length
        if grep_found_nothing or (not grep and offset >= result.total_length):
            # The spec's boundary behaviour: past the end, or no match, is an empty result.
            return ToolResult.of(())
        if grep:
            lines = [f"{m.line_number}: {m.line}" for m in result.matches]
            if not lines:
                # The bounded scan stopped before the end: say where to go on.
                lines.append(f"[No line matches from offset {offset} to {end}.]")
            if end < result.total_length:
                lines.append(f"[More lines may match: continue with offset {end}.]")
            return ToolResult.of((ContentPart.text("\n".join(lines)),))
        return _text_page(result, offset, of="", continue_with="")

    def _binary_for_model(self, run: Run, handle: str, total: int, mime_type: str) -> ToolResult:
        """A model cannot use a byte range: it gets the whole content (an image it can see)
        when small enough, with a line saying what it is."""
        marker = binary_marker(mime_type, total)
        if total > MODEL_MAX_BINARY_BYTES:
            note = f"{marker} Too large to show (over {MODEL_MAX_BINARY_BYTES} bytes)."
            return ToolResult.of((ContentPart.text(note),))
        whole = self._reader.read(run, handle, 0, total, "", MODEL_MAX_BINARY_BYTES)
        note = f"{marker} offset, limit and grep do not apply to binary content."
        content = (ContentPart.text(note), ContentPart(PartKind.BINARY, whole.data, mime_type))
        return ToolResult.of(content, source_handle=handle)

    def load_skill(self, context: RunContext, call: ToolCall) -> ToolResult:
        skills = context.spec.skills
        try:
            arguments = parse_arguments(call.arguments_json, {"name": str}, {"name"})
        except ArgumentError as error:
            return ToolResult.error(f'load_skill: {error}. Expected {{"name": string}}.')
        for skill in skills:
            if skill.name == arguments["name"]:
                return ToolResult.of((ContentPart.text(skill.body or "(This skill is empty.)"),))
        names = ", ".join(skill.name for skill in skills)
        return ToolResult.error(
            f"load_skill: no skill named {arguments['name']!r}. Skills: {names}."
        )


def _query_page(result: ReadResult, offset: int) -> ToolResult:
    """A page of a query's result (compact JSON), saying where to continue when there is more.
    Past its end is an empty result, as for a plain read."""
    if offset >= result.total_length:
        return ToolResult.of(())
    return _text_page(result, offset, of="the query's ", continue_with="the same query and ")


def _text_page(result: ReadResult, offset: int, *, of: str, continue_with: str) -> ToolResult:
    """A page of text (a plain read's, or a query's: `of` and `continue_with` say which),
    ending with a line saying where to continue when there is more."""
    text = result.text
    end = result.next_offset
    if end < result.total_length:
        text += (
            f"\n[Characters {offset} to {end} of {of}{result.total_length}: continue with "
            f"{continue_with}offset {end}.]"
        )
    return ToolResult.of((ContentPart.text(text),))

"""Reading a stored tool result through its handle: in-process, over the log, no sandbox.

Units: offset and limit count characters of the result's text rendering (see
domain/runlog/content.py), or bytes when the result is binary (exactly one binary part).

- A handle that does not resolve, or resolves into another Run, is INVALID_DEFERRED_HANDLE:
  a Run reading a handle it was never given is a protocol violation, never a read.
- Offset past the end, and a grep with no match, give an empty result, not an error.
- grep runs on RE2 (linear time in the text, bounded memory) over the lines of the text
  rendering. A binary result never matches a grep: its bytes are not lines. The pattern
  comes from the model or a host, the text from an MCP server: both untrusted, so the work is
  bounded three ways (docs/security.md). The pattern is capped in length and in compiled
  program size (RE2's slow path costs about program size x bytes); groups never capture
  (only a match's line is wanted, and capturing forces RE2's slowest engine); and the text is
  scanned in chunks of whole lines sized so that one chunk costs at most
  GREP_CHUNK_WORK instruction-bytes, with the CPU budget and the caller's cancellation
  checked between chunks. A line too long to be one such chunk is PATTERN_TOO_COMPLEX; a
  scan that runs out of budget returns the matches so far with `next_offset` where it
  stopped, so the caller continues from there.
- A query (JMESPath, `result_query.py`) runs over the result's JSON: its `structuredContent`
  when the server sent one, else its one text or JSON part. offset and limit then count
  characters of the query's result (compact JSON), which is what `total_length` measures.
  grep and query do not combine.
- A read never exceeds `max_bytes` of text or data, so a response fits in a gRPC message;
  the caller continues from `next_offset`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import re2

from psych_sidecar.domain.cache import ByteBudgetCache
from psych_sidecar.domain.calls import result_query
from psych_sidecar.domain.errors import (
    InvalidDeferredHandle,
    PatternInvalid,
    PatternTooComplex,
    SidecarError,
    field_invalid,
    field_required,
    quoted,
    short,
)
from psych_sidecar.domain.runlog import (
    SEPARATOR,
    STRUCTURED_CONTENT_MIME,
    ByteRange,
    LogReader,
    PartKind,
    PartMeta,
    Run,
    RunService,
    TextLayout,
    binary_marker,
    fetch_text,
    model_view,
)

MAX_PATTERN_CHARS = 1024
# The compiled program's memory bound (RE2's own default); a pattern needing more is refused.
PATTERN_MAX_MEM_BYTES = 8 << 20
# The largest compiled program accepted. RE2's NFA, its fallback when the DFA runs out of
# memory on adversarial text, costs up to ~15 ns per instruction per byte, so the program
# size bounds the cost per byte (2000 admits \p{L}+, whose Unicode class is ~1200).
MAX_PROGRAM_SIZE = 2000
# One chunk (whole lines) costs at most this many instruction-bytes (program size x bytes):
# under a second at the NFA's worst (~15 ns per instruction-byte, measured), milliseconds
# when the DFA copes (nearly always).
GREP_CHUNK_WORK = 50_000_000
# CPU time (this thread's) one grep call may spend scanning before it returns what it has.
GREP_CPU_BUDGET_SECONDS = 5.0
# How long a result parsed for a query is kept without being queried again.
PARSED_KEEP_SECONDS = 60.0
# Each matching line is returned twice (as text and as a match), plus a little framing.
_MATCH_OVERHEAD_BYTES = 24


@dataclass(frozen=True, slots=True)
class GrepMatch:
    line_number: int
    offset: int
    line: str


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What one read returns. `binary` results carry `data` and `mime_type`; text results
    carry `text` (and `matches` when grep was set)."""

    binary: bool
    text: str
    data: bytes
    mime_type: str
    total_length: int
    next_offset: int
    matches: tuple[GrepMatch, ...]


def never_stop() -> bool:
    return False


def invalid_handle(run_id: str, handle: str) -> SidecarError:
    return InvalidDeferredHandle(
        f"handle {quoted(handle)} is not a tool result of run {short(run_id)}",
        run_id=short(run_id),
        handle=short(handle),
    )


def _pattern_error(
    kind: type[PatternInvalid | PatternTooComplex], field: str, detail: str
) -> PatternInvalid | PatternTooComplex:
    return kind(f"{field}: {detail}", field=field, detail=detail)


def compile_pattern(pattern: str, field: str) -> Any:
    """An RE2 program matching within single lines (never across a newline), `^` and `$`
    at line boundaries, groups not capturing. Refused with PATTERN_INVALID when too long or
    not RE2, PATTERN_TOO_COMPLEX when its program is too large."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise _pattern_error(PatternInvalid, field, f"longer than {MAX_PATTERN_CHARS} characters")
    options = re2.Options()
    options.never_nl = True
    options.never_capture = True
    options.log_errors = False
    options.max_mem = PATTERN_MAX_MEM_BYTES
    try:
        # Checked as given first, so an error quotes the model's pattern, not the (?m) we add.
        re2.compile(pattern, options)
        compiled = re2.compile("(?m)" + pattern, options)
    except re2.error as error:
        message = error.args[0] if error.args else ""
        detail = message.decode(errors="replace") if isinstance(message, bytes) else str(message)
        if "too large" in detail or "too big" in detail:
            raise _pattern_error(
                PatternTooComplex,
                field,
                f"compiles to a program larger than RE2's memory bound ({detail}); "
                "use fewer or smaller repetitions and narrower character classes",
            ) from None
        raise PatternInvalid(
            f"{field}: not a valid RE2 pattern: {detail}",
            field=field,
            detail=detail,
        ) from None
    if compiled.programsize > MAX_PROGRAM_SIZE:
        raise _pattern_error(
            PatternTooComplex,
            field,
            f"compiles to an RE2 program of {compiled.programsize} instructions, more than "
            f"{MAX_PROGRAM_SIZE}; use fewer or smaller repetitions ({{n}}) and narrower "
            "character classes (\\p{L} and case-folding are large)",
        )
    return compiled


class _Span(NamedTuple):
    """What one read covers: a tool result's rendering (`layout`), from `offset`, at most
    `limit` characters (0: no limit) and `max_bytes` bytes."""

    run_id: str
    sequence: int
    layout: TextLayout
    offset: int
    limit: int
    max_bytes: int


class ToolOutputReader:
    """The one reader behind the ReadToolOutput RPC and the model's read_tool_output tool."""

    def __init__(self, runs: RunService, log: LogReader, *, parsed_cache_bytes: int = 0) -> None:
        self._runs = runs
        self._log = log
        # Results parsed for a query, kept for the next query of the same result: agents query
        # one large result several times (filter, count, page through what a query yields),
        # and parsing is most of a query's time. Bounded by the memory their values take, as
        # `result_query.parsed_bytes` estimates it; a stored result never changes, so an entry
        # is never stale (a deleted Run's are unreachable: its handles no longer resolve).
        # `forget_unused_parsed` drops what no query used for PARSED_KEEP_SECONDS, so an idle
        # sidecar does not hold them.
        self._parsed: ByteBudgetCache[tuple[str, int], _Parsed] = ByteBudgetCache(
            parsed_cache_bytes, lambda parsed: parsed.memory_bytes
        )

    def forget_unused_parsed(self) -> int:
        """Drop the parsed results no query used for PARSED_KEEP_SECONDS; how many."""
        now = time.monotonic()
        return self._parsed.discard_where(lambda parsed: now - parsed.used > PARSED_KEEP_SECONDS)

    def resolve(self, run: Run, handle: str) -> int:
        """The sequence of the tool result `handle` names in this Run."""
        if not handle:
            raise field_required("handle")
        found = self._log.resolve_handle(handle)
        if found is None or found[0] != run.run_id:
            if found is None:
                # A deleted Run's handles are RUN_NOT_FOUND, not a protocol violation.
                self._runs.confirm(run)
            raise invalid_handle(run.run_id, handle)
        return found[1]

    def read(
        self,
        run: Run | str,
        handle: str,
        offset: int,
        limit: int,
        grep: str,
        max_bytes: int,
        stop: Callable[[], bool] = never_stop,
        *,
        query: str = "",
    ) -> ReadResult:
        """ReadToolOutput: the Run (given by id, it must exist), and the handle must be one of
        its results. `stop` says the caller gave up (cancelled, deadline passed): a grep ends
        early, a query fails."""
        if isinstance(run, str):
            run = self._runs.get(run)
        if offset < 0:
            raise field_invalid("offset", "must not be negative")
        if limit < 0:
            raise field_invalid("limit", "must not be negative")
        if grep and query:
            raise field_invalid("query", "grep and query cannot be combined; use one")
        sequence = self.resolve(run, handle)
        if query:
            compiled = result_query.compile_query(query)
            text = result_query.evaluate(compiled, self._shared_json_of(run.run_id, sequence), stop)
            return _page(text, offset, limit, max_bytes)
        pattern = compile_pattern(grep, "grep") if grep else None
        metas = self._log.part_metas(run.run_id, [sequence]).get(sequence, [])
        # The rendering of what the model sees in full (`model_view`), so that offsets in
        # a preview's guidance continue where its head stops.
        span = _Span(run.run_id, sequence, TextLayout(model_view(metas)), offset, limit, max_bytes)
        if span.layout.is_binary:
            return self._read_binary(span, pattern)
        if pattern is not None:
            return self._grep(span, pattern, stop)
        return self._read_text(span)

    def _shared_json_of(self, run_id: str, sequence: int) -> Any:
        """`json_of`, from the parsed results kept when there (shared by every query of the
        result: read, never changed; a query's evaluation builds new values)."""
        kept = self._parsed.get((run_id, sequence))
        if kept is not None:
            kept.used = time.monotonic()
            return kept.value
        metas = self._log.part_metas(run_id, [sequence]).get(sequence, [])
        part = _json_part(metas)
        value = self._parse(run_id, sequence, part)
        memory = result_query.parsed_bytes(part.byte_length)
        self._parsed.put((run_id, sequence), _Parsed(value, memory, time.monotonic()))
        return value

    def json_of(self, run_id: str, sequence: int, metas: list[PartMeta]) -> Any:
        """The JSON value of a stored result (parsed, the caller's own; FIELD_INVALID when
        there is none): its structured content, else its one text or JSON part as the model
        sees it."""
        return self._parse(run_id, sequence, _json_part(metas))

    def _parse(self, run_id: str, sequence: int, part: PartMeta) -> Any:
        result_query.check_source_size(part.byte_length)
        (data,) = self._log.read_ranges(
            run_id, [ByteRange(sequence, part.index, 0, part.byte_length)]
        )
        return result_query.parse_source(data)

    def _read_binary(self, span: _Span, pattern: Any) -> ReadResult:
        run_id, sequence, layout, offset, limit, max_bytes = span
        part = layout.parts[0]
        total = part.byte_length
        end = min(total, offset + (limit or total), offset + max_bytes)
        data = b""
        if pattern is None and offset < end:
            (data,) = self._log.read_ranges(
                run_id, [ByteRange(sequence, part.index, offset, end - offset)]
            )
        # Bytes are not lines: a grep over binary content matches nothing.
        next_offset = total if pattern is not None or offset >= total else end
        return ReadResult(True, "", data, part.mime_type, total, next_offset, ())

    def _read_text(self, span: _Span) -> ReadResult:
        run_id, sequence, layout, offset, limit, max_bytes = span
        total = layout.total_chars
        if offset >= total:
            return ReadResult(False, "", b"", "", total, total, ())
        # A character is at least one byte, so max_bytes characters bound what to fetch.
        end = min(total, offset + (limit or total), offset + max_bytes)
        (text,) = fetch_text(self._log, run_id, [(sequence, layout.pieces(offset, end))])
        if not layout.is_ascii:
            encoded = text.encode()
            if len(encoded) > max_bytes:
                text = encoded[:max_bytes].decode(errors="ignore")
        return ReadResult(False, text, b"", "", total, offset + len(text), ())

    def _grep(self, span: _Span, pattern: Any, stop: Callable[[], bool]) -> ReadResult:
        run_id, sequence, layout, offset, limit, max_bytes = span
        total = layout.total_chars
        if offset >= total:
            return ReadResult(False, "", b"", "", total, total, ())
        data = self._rendering_bytes(run_id, sequence, layout)
        chunk_bytes = max(GREP_CHUNK_WORK // max(pattern.programsize, 1), 1)
        began = time.thread_time()
        chunk_end = -1
        positions = _CharPositions(data, layout.is_ascii)
        start = positions.byte_of(offset)
        line_number = data.count(b"\n", 0, start) + 1
        counted_to = start
        matches: list[GrepMatch] = []
        used_chars = used_bytes = 0
        position = start
        next_offset = total
        while position <= len(data):
            if position > chunk_end:
                # Between chunks: has the caller given up, or the budget run out?
                if stop() or time.thread_time() - began > GREP_CPU_BUDGET_SECONDS:
                    next_offset = positions.char_of(position)
                    break
                chunk_end = _chunk_end(data, position, chunk_bytes, pattern.programsize)
            found = pattern.search(data, position, chunk_end)
            if found is None:
                position = chunk_end + 1
                continue
            line_start = max(data.rfind(b"\n", 0, found.start()) + 1, start)
            if line_start == len(data) and line_start > 0 and data.endswith(b"\n"):
                break  # the empty string after a final newline is not a line
            line_end = data.find(b"\n", line_start)
            if line_end < 0:
                line_end = len(data)
            line = data[line_start:line_end].decode()
            cost = 2 * len(line.encode()) + _MATCH_OVERHEAD_BYTES
            over_chars = limit and used_chars + len(line) > limit
            if matches and (over_chars or used_bytes + cost > max_bytes):
                next_offset = positions.char_of(line_start)
                break
            line_number += data.count(b"\n", counted_to, line_start)
            counted_to = line_start
            if not matches:
                # One line always comes back, cut to fit the page if it must be.
                byte_room = (max_bytes - _MATCH_OVERHEAD_BYTES) // 2
                line = _cut_to_bytes(line[: limit or len(line)], byte_room)
                cost = 2 * len(line.encode()) + _MATCH_OVERHEAD_BYTES
            matches.append(GrepMatch(line_number, positions.char_of(line_start), line))
            used_chars += len(line)
            used_bytes += cost
            position = line_end + 1
        text = SEPARATOR.join(match.line for match in matches)
        return ReadResult(False, text, b"", "", total, next_offset, tuple(matches))

    def _rendering_bytes(self, run_id: str, sequence: int, layout: TextLayout) -> bytes:
        texts = [part for part in layout.parts if part.kind is not PartKind.BINARY]
        loaded = iter(
            self._log.read_ranges(
                run_id, [ByteRange(sequence, p.index, 0, p.byte_length) for p in texts]
            )
        )
        rendered = [
            binary_marker(part.mime_type, part.byte_length).encode()
            if part.kind is PartKind.BINARY
            else next(loaded)
            for part in layout.parts
        ]
        return rendered[0] if len(rendered) == 1 else SEPARATOR.encode().join(rendered)


@dataclass(slots=True)
class _Parsed:
    """A result's JSON, parsed for queries; `used`: when a query last used it (monotonic)."""

    value: Any
    memory_bytes: int
    used: float


def _json_part(metas: list[PartMeta]) -> PartMeta:
    """The part a query runs on (FIELD_INVALID when there is none): the result's structured
    content, else its one text or JSON part as the model sees it."""
    structured = [
        p for p in metas if p.kind is PartKind.JSON and p.mime_type == STRUCTURED_CONTENT_MIME
    ]
    shown = model_view(metas)
    parts = structured or shown
    if len(parts) != 1 or parts[0].kind is PartKind.BINARY:
        what = (
            "is binary"
            if parts and parts[0].kind is PartKind.BINARY
            else (f"has {len(shown)} parts and no structured content")
        )
        raise field_invalid(
            "query",
            f"the result {what}, not one JSON document; use grep, or offset and limit",
        )
    return parts[0]


def _page(text: str, offset: int, limit: int, max_bytes: int) -> ReadResult:
    """Characters [offset, offset + limit) of a query's result, at most `max_bytes`."""
    total = len(text)
    if offset >= total:
        return ReadResult(False, "", b"", "", total, total, ())
    end = min(total, offset + (limit or total), offset + max_bytes)
    page = _cut_to_bytes(text[offset:end], max_bytes)
    return ReadResult(False, page, b"", "", total, offset + len(page), ())


def _chunk_end(data: bytes, position: int, chunk_bytes: int, program_size: int) -> int:
    """Where the chunk from `position` ends: the newline ending its last whole line (or the
    end of the text), at most `chunk_bytes` on. A search up to there sees whole lines only,
    so `$` and `\\b` behave as in one search over the whole text."""
    if len(data) - position <= chunk_bytes:
        return len(data)
    cut = data.rfind(b"\n", position, position + chunk_bytes + 1)
    if cut >= 0:
        return cut
    line_end = data.find(b"\n", position)
    length = (len(data) if line_end < 0 else line_end) - position
    detail = (
        f"a line of {length} bytes is too long to be searched in bounded time with a pattern "
        f"of {program_size} RE2 instructions (at most {chunk_bytes} bytes per line for it); "
        "use a simpler pattern, or read the line by offset"
    )
    raise _pattern_error(PatternTooComplex, "grep", detail)


def _cut_to_bytes(text: str, max_bytes: int) -> str:
    encoded = text.encode()
    return text if len(encoded) <= max_bytes else encoded[:max_bytes].decode(errors="ignore")


class _CharPositions:
    """Character offsets of byte positions in UTF-8 text, for positions visited in order
    (each counted once, so a whole scan stays linear)."""

    def __init__(self, data: bytes, ascii_only: bool) -> None:
        self._data = data
        self._ascii = ascii_only
        self._byte = 0
        self._char = 0

    def byte_of(self, char_offset: int) -> int:
        if self._ascii:
            return char_offset
        return len(self._data.decode()[:char_offset].encode())

    def char_of(self, byte_position: int) -> int:
        if self._ascii:
            return byte_position
        assert byte_position >= self._byte, "positions are visited in order"
        self._char += len(self._data[self._byte : byte_position].decode())
        self._byte = byte_position
        return self._char

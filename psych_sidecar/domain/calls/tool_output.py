"""Reading a stored tool result through its handle: in-process, over the log, no sandbox.

Units: offset and limit count characters of the result's text rendering (see
domain/runlog/content.py), or bytes when the result is binary (exactly one binary part).

- A handle that does not resolve, or resolves into another Run, is INVALID_DEFERRED_HANDLE:
  a Run reading a handle it was never given is a protocol violation, never a read.
- Offset past the end, and a grep with no match, give an empty result, not an error.
- grep runs on RE2 (linear time in the text, bounded memory) over the lines of the text
  rendering; patterns are bounded in length. A binary result never matches a grep: its
  bytes are not lines.
- A read never exceeds `max_bytes` of text or data, so a response fits in a gRPC message;
  the caller continues from `next_offset`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import re2

from psych_sidecar.domain.errors import Reason, SidecarError, field_invalid, field_required
from psych_sidecar.domain.runlog import (
    SEPARATOR,
    ByteRange,
    LogReader,
    PartKind,
    Run,
    RunService,
    TextLayout,
    binary_marker,
    fetch_text,
)

MAX_PATTERN_CHARS = 1024
# The compiled program's memory bound (RE2's own default); a pattern needing more is refused.
PATTERN_MAX_MEM_BYTES = 8 << 20
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


def invalid_handle(run_id: str, handle: str) -> SidecarError:
    return SidecarError(
        Reason.INVALID_DEFERRED_HANDLE,
        f"handle {handle!r} is not a tool result of run {run_id}",
        run_id=run_id,
        handle=handle,
    )


def compile_pattern(pattern: str, field: str) -> Any:
    """An RE2 program matching within single lines (never across a newline), `^` and `$`
    at line boundaries. Refused with PATTERN_INVALID when too long or not RE2."""
    if len(pattern) > MAX_PATTERN_CHARS:
        detail = f"longer than {MAX_PATTERN_CHARS} characters"
        raise SidecarError(Reason.PATTERN_INVALID, f"{field}: {detail}", field=field, detail=detail)
    options = re2.Options()
    options.never_nl = True
    options.log_errors = False
    options.max_mem = PATTERN_MAX_MEM_BYTES
    try:
        # Checked as given first, so an error quotes the model's pattern, not the (?m) we add.
        re2.compile(pattern, options)
        return re2.compile("(?m)" + pattern, options)
    except re2.error as error:
        message = error.args[0] if error.args else ""
        detail = message.decode(errors="replace") if isinstance(message, bytes) else str(message)
        raise SidecarError(
            Reason.PATTERN_INVALID,
            f"{field}: not a valid RE2 pattern: {detail}",
            field=field,
            detail=detail,
        ) from None


class ToolOutputReader:
    """The one reader behind the ReadToolOutput RPC and the model's read_tool_output tool."""

    def __init__(self, runs: RunService, log: LogReader) -> None:
        self._runs = runs
        self._log = log

    def read(
        self, run_id: str, handle: str, offset: int, limit: int, grep: str, max_bytes: int
    ) -> ReadResult:
        """ReadToolOutput: the Run must exist, and the handle must be one of its results."""
        return self.read_in(self._runs.get(run_id), handle, offset, limit, grep, max_bytes)

    def resolve(self, run: Run, handle: str) -> int:
        """The sequence of the tool result `handle` names in this Run."""
        if not handle:
            raise field_required("handle")
        found = self._log.resolve_handle(handle)
        if found is None or found[0] != run.run_id:
            raise invalid_handle(run.run_id, handle)
        return found[1]

    def read_in(
        self,
        run: Run,
        handle: str,
        offset: int,
        limit: int,
        grep: str,
        max_bytes: int,
    ) -> ReadResult:
        if offset < 0:
            raise field_invalid("offset", "must not be negative")
        if limit < 0:
            raise field_invalid("limit", "must not be negative")
        sequence = self.resolve(run, handle)
        pattern = compile_pattern(grep, "grep") if grep else None
        layout = TextLayout(self._log.part_metas(run.run_id, [sequence]).get(sequence, []))
        if layout.is_binary:
            return self._read_binary(
                run.run_id, sequence, layout, offset, limit, pattern, max_bytes
            )
        if pattern is not None:
            return self._grep(run.run_id, sequence, layout, offset, limit, pattern, max_bytes)
        return self._read_text(run.run_id, sequence, layout, offset, limit, max_bytes)

    def _read_binary(
        self,
        run_id: str,
        sequence: int,
        layout: TextLayout,
        offset: int,
        limit: int,
        pattern: Any,
        max_bytes: int,
    ) -> ReadResult:
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

    def _read_text(
        self,
        run_id: str,
        sequence: int,
        layout: TextLayout,
        offset: int,
        limit: int,
        max_bytes: int,
    ) -> ReadResult:
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

    def _grep(
        self,
        run_id: str,
        sequence: int,
        layout: TextLayout,
        offset: int,
        limit: int,
        pattern: Any,
        max_bytes: int,
    ) -> ReadResult:
        total = layout.total_chars
        if offset >= total:
            return ReadResult(False, "", b"", "", total, total, ())
        data = self._rendering_bytes(run_id, sequence, layout)
        positions = _CharPositions(data, layout.is_ascii)
        start = positions.byte_of(offset)
        line_number = data.count(b"\n", 0, start) + 1
        counted_to = start
        matches: list[GrepMatch] = []
        used_chars = used_bytes = 0
        position = start
        next_offset = total
        while position <= len(data):
            found = pattern.search(data, position)
            if found is None:
                break
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

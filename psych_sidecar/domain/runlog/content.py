"""A stored tool result's text rendering, planned from part sizes without loading content.

Offsets into a tool result are characters of its **text rendering**: its parts in order,
joined by one newline, where a text part is its text, a JSON part its JSON text exactly as
stored, and a binary part the one-line marker `[binary content: MIME, N bytes]` (bytes are
never decoded as text). A result that is exactly one binary part is **binary**: it is read
in bytes instead.

Storage keeps each part's byte length and character count, so a slice of the rendering maps
to byte ranges of single parts: the domain asks storage for those ranges only and cuts them
at UTF-8 character boundaries here.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psych_sidecar.domain.runlog.runs import PartKind, RecordKind, ToolCall

if TYPE_CHECKING:
    # ports.py imports this module's shapes; here the port is only an annotation.
    from psych_sidecar.domain.runlog.ports import LogReader

SEPARATOR = "\n"
MAX_UTF8_BYTES_PER_CHAR = 4


def binary_marker(mime_type: str, byte_length: int) -> str:
    """How a binary part appears wherever content is shown as text."""
    return f"[binary content: {mime_type}, {byte_length} bytes]"


@dataclass(frozen=True, slots=True)
class PartMeta:
    """One stored part's shape: what storage knows without reading its bytes."""

    index: int
    kind: PartKind
    mime_type: str
    byte_length: int
    char_count: int | None  # None for binary parts

    @property
    def rendered_chars(self) -> int:
        if self.kind is PartKind.BINARY:
            return len(binary_marker(self.mime_type, self.byte_length))
        assert self.char_count is not None
        return self.char_count

    @property
    def is_ascii(self) -> bool:
        return self.char_count == self.byte_length


@dataclass(frozen=True, slots=True)
class RecordSkeleton:
    """A record without its content: enough for assembly to find turns, batches and sizes,
    and the one record summary the inspectors list (``inspect log``, the web inspector)."""

    sequence: int
    kind: RecordKind
    handle: str
    call_id: str
    server: str
    tool: str
    is_error: bool
    tool_calls: tuple[ToolCall, ...]
    content_bytes: int


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes [start, start + length) of one stored part."""

    sequence: int
    part_index: int
    start: int
    length: int


@dataclass(frozen=True, slots=True)
class CharSlice:
    """Characters [start, end) of one text or JSON part, and the bytes that hold them."""

    part: PartMeta
    start: int
    end: int

    def byte_range(self, sequence: int) -> ByteRange:
        part = self.part
        if part.is_ascii:
            return ByteRange(sequence, part.index, self.start, self.end - self.start)
        assert part.char_count is not None
        from_head = MAX_UTF8_BYTES_PER_CHAR * self.end
        from_tail = MAX_UTF8_BYTES_PER_CHAR * (part.char_count - self.start)
        if from_head <= from_tail:
            return ByteRange(sequence, part.index, 0, min(from_head, part.byte_length))
        start = max(part.byte_length - from_tail, 0)
        return ByteRange(sequence, part.index, start, part.byte_length - start)

    def cut(self, window: bytes, window_start: int) -> str:
        """The slice's characters out of the bytes fetched for `byte_range`."""
        part = self.part
        if part.is_ascii:
            return window.decode()
        assert part.char_count is not None
        if window_start == 0:
            text = codecs.getincrementaldecoder("utf-8")().decode(window, final=False)
            return text[self.start : self.end]
        # A window ending at the part's end may start inside a character: skip its rest.
        skip = 0
        while skip < len(window) and window[skip] & 0xC0 == 0x80:
            skip += 1
        text = window[skip:].decode()
        wanted = part.char_count - self.start
        return text[len(text) - wanted :][: self.end - self.start]


Piece = str | CharSlice


class TextLayout:
    """Where each part of a result sits in its text rendering, from part sizes alone."""

    def __init__(self, parts: Sequence[PartMeta]) -> None:
        self.parts = tuple(parts)
        starts = []
        position = 0
        for index, part in enumerate(self.parts):
            if index:
                position += len(SEPARATOR)
            starts.append(position)
            position += part.rendered_chars
        self._starts = tuple(starts)
        self.total_chars = position

    @property
    def is_binary(self) -> bool:
        """Exactly one binary part: read in bytes, never as text."""
        return len(self.parts) == 1 and self.parts[0].kind is PartKind.BINARY

    @property
    def is_ascii(self) -> bool:
        return all(p.kind is PartKind.BINARY or p.is_ascii for p in self.parts)

    @property
    def has_binary(self) -> bool:
        return any(p.kind is PartKind.BINARY for p in self.parts)

    def pieces(self, start: int, end: int) -> list[Piece]:
        """Characters [start, end) of the rendering as literal text and part slices."""
        start, end = max(start, 0), min(end, self.total_chars)
        pieces: list[Piece] = []
        for index, (part, part_start) in enumerate(zip(self.parts, self._starts, strict=True)):
            if index:
                separator_at = part_start - len(SEPARATOR)
                if start <= separator_at < end:
                    pieces.append(SEPARATOR)
            low = max(start - part_start, 0)
            high = min(end - part_start, part.rendered_chars)
            if low >= high:
                continue
            if part.kind is PartKind.BINARY:
                pieces.append(binary_marker(part.mime_type, part.byte_length)[low:high])
            else:
                pieces.append(CharSlice(part, low, high))
        return pieces


def fetch_text(
    reader: LogReader, run_id: str, requests: Sequence[tuple[int, Sequence[Piece]]]
) -> list[str]:
    """Resolve many (sequence, pieces) requests into text with one batched storage read."""
    ranges: list[ByteRange] = []
    for sequence, pieces in requests:
        ranges.extend(p.byte_range(sequence) for p in pieces if isinstance(p, CharSlice))
    windows: Mapping[ByteRange, bytes] = dict(
        zip(ranges, reader.read_ranges(run_id, ranges), strict=True)
    )
    texts = []
    for sequence, pieces in requests:
        out = []
        for piece in pieces:
            if isinstance(piece, str):
                out.append(piece)
            else:
                window_range = piece.byte_range(sequence)
                out.append(piece.cut(windows[window_range], window_range.start))
        texts.append("".join(out))
    return texts

"""What a retried tool call is answered with, kept without a second copy of the result.

A tool call's answer is its MCP CallToolResult JSON, and almost all of that JSON is the
content the Run's log already holds as the result record's parts (a text block's text, an
image's bytes, the structured content). The ledger keeps only the rest — the JSON with each
spelled-out part cut away — and where each part goes back (:class:`CallResultOutline`); a
retry reads the record's parts and splices them in, byte for byte the first answer.

Cutting is by bytes, not by parsing: a part's spelling is searched for in the JSON, so a part
not found as spelled (a text the server escaped differently, a blob it padded oddly) simply
stays in the outline. The outline is then larger, never wrong.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from psych_sidecar.bulk.slices import b64encode_sliced, json_sliced
from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.runlog.runs import STRUCTURED_CONTENT_MIME, ContentPart, PartKind

# A part shorter than this stays in the outline: a splice costs more to note than it saves.
MIN_SPLICED_BYTES = 64

_QUOTE = ord('"')
# How much of a part `_find` searches for before comparing the rest in place.
_HEAD_BYTES = 64


class Spelling(StrEnum):
    """How a part is spelled in the result JSON."""

    # The part's UTF-8 text between quotes: a text block's `text` with nothing to escape.
    QUOTED = "quoted"
    # A JSON string of the part's UTF-8 text, escaped.
    STRING = "string"
    # The part's bytes as they are (structured content, a content block kept as JSON).
    RAW = "raw"
    # A JSON string of the part's bytes in base64 (an image's, audio's or blob's `data`).
    BASE64 = "base64"


@dataclass(frozen=True, slots=True)
class Splice:
    """Part `part_index`, spelled `spelling`, goes back at byte `offset` of the outline."""

    offset: int
    part_index: int
    spelling: Spelling


@dataclass(frozen=True, slots=True)
class CallResultOutline:
    """A result JSON less the parts the log holds (`outline`), and where they go back."""

    outline: bytes
    splices: tuple[Splice, ...]

    @classmethod
    def of(cls, result_json: bytes, content: Sequence[ContentPart]) -> CallResultOutline:
        """`result_json` with every part of `content` that it spells, in order, cut away."""
        kept: list[bytes] = []
        splices: list[Splice] = []
        cursor = length = 0
        for index, part in enumerate(content):
            if len(part.data) < MIN_SPLICED_BYTES:
                continue
            for spelling in _spellings(part):
                span = _find(result_json, part, spelling, cursor)
                if span is None:
                    continue
                start, end = span
                kept.append(result_json[cursor:start])
                length += start - cursor
                splices.append(Splice(length, index, spelling))
                cursor = end
                break
        if not splices:
            return cls(result_json, ())
        kept.append(result_json[cursor:])
        return cls(b"".join(kept), tuple(splices))

    def result_json(self, content: Sequence[ContentPart]) -> bytes:
        """The result JSON again, from the record's parts."""
        pieces: list[bytes] = []
        cursor = 0
        for splice in self.splices:
            pieces.append(self.outline[cursor : splice.offset])
            pieces.extend(_spelled(content[splice.part_index], splice.spelling))
            cursor = splice.offset
        pieces.append(self.outline[cursor:])
        return b"".join(pieces)

    def splices_json(self) -> str:
        return json.dumps([[s.offset, s.part_index, s.spelling.value] for s in self.splices])

    @classmethod
    def stored(cls, outline: bytes, splices_json: str) -> CallResultOutline:
        splices = tuple(
            Splice(offset, index, Spelling(spelling))
            for offset, index, spelling in json.loads(splices_json)
        )
        return cls(outline, splices)


def _spellings(part: ContentPart) -> tuple[Spelling, ...]:
    if part.kind is PartKind.BINARY:
        return (Spelling.BASE64,)
    if part.kind is PartKind.TEXT:
        return (Spelling.QUOTED, Spelling.STRING)
    if part.mime_type == STRUCTURED_CONTENT_MIME:
        return (Spelling.RAW,)
    # A JSON part is a sidecar tool's text (a listing, as a string) or a content block the
    # server sent that has no part kind of its own (as the block's JSON).
    return (Spelling.QUOTED, Spelling.STRING, Spelling.RAW)


def _spelled(part: ContentPart, spelling: Spelling) -> list[bytes]:
    """The part's bytes as spelled in the result JSON, in pieces (joined once, by the caller)."""
    if spelling is Spelling.RAW:
        return [part.data]
    if spelling is Spelling.QUOTED:
        return [b'"', part.data, b'"']
    if spelling is Spelling.BASE64:
        return [b'"', b64encode_sliced(part.data).encode(), b'"']
    return [json_sliced(part.as_text(), canonical_json)]


def _find(
    result_json: bytes, part: ContentPart, spelling: Spelling, start: int
) -> tuple[int, int] | None:
    """Where the part, spelled, first occurs in `result_json` from `start`."""
    if spelling is Spelling.QUOTED:
        # Its bytes between quotes, found by their first bytes and compared in place: no
        # needle of the whole part to copy or preprocess.
        data = part.data
        head = data[:_HEAD_BYTES]
        at = result_json.find(head, start + 1)
        while at >= 0:
            end = at + len(data)
            if (
                result_json[at - 1] == _QUOTE
                and result_json[end : end + 1] == b'"'
                and result_json.startswith(data, at)
            ):
                return at - 1, end + 1
            at = result_json.find(head, at + 1)
        return None
    needle = b"".join(_spelled(part, spelling))
    at = result_json.find(needle, start)
    return None if at < 0 else (at, at + len(needle))

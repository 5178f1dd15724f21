"""Long texts and byte strings handled a slice at a time, the GIL offered between slices.

One C call over a value of tens of MB (an encode, an escape, a base64 pass) holds the GIL for
tens of ms, and every other thread, the event loop's included, waits that long, though the
call runs on a worker thread. Each helper here gives exactly what the one call gives, slice
by slice, each slice a fraction of a millisecond (docs/operations.md, "Message sizes").
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

__all__ = [
    "SLICE_CHARS",
    "b64decode_sliced",
    "b64encode_sliced",
    "json_sliced",
    "needs_no_json_escape",
    "sliced",
    "utf8_char_count",
    "utf8_sliced",
]

# Values longer than this (characters, or bytes where the helper reads bytes) are handled in
# slices this long: 256 Ki, well under a millisecond of work each (each helper's default
# `slice_chars`).
SLICE_CHARS = 1 << 18
# How deep json_sliced looks for long strings: an MCP result's text sits at
# result → content → block → text; deeper data is encoded in one call as usual.
_SLICED_DEPTH = 4
# UTF-8 continuation bytes: every other byte of valid UTF-8 starts a character.
_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))
# What a JSON string escapes when it keeps non-ASCII text as UTF-8 (json.dumps with
# ensure_ascii=False): control characters, the quote and the backslash.
_JSON_ESCAPED = re.compile(rb'[\x00-\x1f"\\]')

Sliceable = TypeVar("Sliceable", str, bytes, memoryview)


def sliced(value: Sliceable, step: int) -> Iterator[Sliceable]:
    """`value` in consecutive slices of `step` items, the GIL offered after each (once the
    caller has handled the slice). Left to the interpreter, a thread that wants the GIL gets
    it only after the switch interval, and with several threads waiting not necessarily the
    event loop's: a loop waited 4-8 ms at a time beside a 50 MB result's encoding, ~0.5 ms
    with the offer."""
    for start in range(0, len(value), step):
        yield value[start : start + step]
        _offer_gil()


def _offer_gil() -> None:
    """Let any thread waiting for the GIL take it now (a zero sleep releases it)."""
    time.sleep(0)


def utf8_sliced(text: str, *, slice_chars: int = SLICE_CHARS) -> bytes:
    """`text.encode()`, a slice at a time when it is long (see SLICE_CHARS)."""
    if len(text) <= slice_chars:
        return text.encode()
    return b"".join(piece.encode() for piece in sliced(text, slice_chars))


def utf8_char_count(data: bytes, *, slice_chars: int = SLICE_CHARS) -> int:
    """The characters in UTF-8 text (valid: it was encoded from a string); ASCII, the usual
    case, is counted without decoding. A text of tens of MB is counted in slices, as its
    bytes less its continuation bytes: one scan of it held the GIL for milliseconds."""
    if len(data) <= slice_chars:
        return len(data) if data.isascii() else len(data.decode())
    continuation = 0
    for view in sliced(memoryview(data), slice_chars):
        piece = view.tobytes()
        if not piece.isascii():
            continuation += len(piece) - len(piece.translate(None, _CONTINUATION_BYTES))
    return len(data) - continuation


def b64encode_sliced(data: bytes, *, slice_chars: int = SLICE_CHARS) -> str:
    """`base64.b64encode(data).decode()`, a slice at a time when it is long: one call over a
    37.5 MB image held the GIL ~60 ms to encode and ~30 ms to make the string. Every slice
    but the last is a whole number of 3-byte groups, so the pieces join to the whole's
    encoding; only their final join (a copy) is one call."""
    step = slice_chars // 4 * 3
    if len(data) <= step:
        return base64.b64encode(data).decode()
    return "".join(base64.b64encode(piece).decode() for piece in sliced(memoryview(data), step))


def b64decode_sliced(data: str, *, slice_chars: int = SLICE_CHARS) -> bytes:
    """`base64.b64decode(data, validate=True)`: the same bytes, and the same data refused
    (binascii.Error or ValueError), decoded `slice_chars` characters at a time. One call over
    a 50 MB image or blob held the GIL ~145 ms; beside four such results the worst health
    check fell from 133-147 ms to 8-11 ms. Every slice but the last is a whole number of
    4-character groups, so it decodes alone to exactly its share of the bytes; padding
    anywhere but in the last slice is refused, as it is in the whole."""
    if len(data) <= slice_chars:
        return base64.b64decode(data, validate=True)
    pieces = []
    last = (len(data) - 1) // slice_chars
    for index, piece in enumerate(sliced(data, slice_chars)):
        if "=" in piece and index < last:
            raise binascii.Error("base64 padding before the end of the data")
        pieces.append(base64.b64decode(piece, validate=True))
    return b"".join(pieces)


def needs_no_json_escape(data: bytes, *, slice_chars: int = SLICE_CHARS) -> bool:
    """Whether UTF-8 text has nothing a JSON string escapes (see `json_sliced`'s `plain`),
    looked for a slice at a time."""
    return not any(_JSON_ESCAPED.search(view) for view in sliced(memoryview(data), slice_chars))


def json_sliced(
    value: Any,
    encode: Callable[[Any], bytes],
    plain: Sequence[tuple[str, bytes]] = (),
    *,
    slice_chars: int = SLICE_CHARS,
) -> bytes:
    """`encode(value)`, the same bytes, for values that may carry very long strings near the
    top (an MCP tool result's text): each is escaped and encoded slice by slice, the rest in
    one call. `encode` is a JSON encoder (the sidecar's canonical one, UTF-8 kept as is); it
    spells a string as its characters escaped one by one between quotes, so slices join to
    the whole string's spelling. With utf8_sliced, this took the longest health check while
    50 MB results landed from 123 ms to 24-27 ms.

    `plain` pairs long strings of `value` (the objects themselves) with their UTF-8 bytes,
    already made, that need no escaping (`needs_no_json_escape`): such a string is spelled
    as those bytes between quotes, and the only copy of it made here is the final join's —
    not its encoding too, slices that would live until the join beside it."""
    long: list[str] = []
    # Each long string is swapped for one placeholder no party can predict, found again in
    # the encoded skeleton (JSON spells the NULs as \u0000) and replaced in order.
    placeholder = f"\x00{secrets.token_hex(16)}\x00"
    skeleton = _swap_long_strings(value, placeholder, long, _SLICED_DEPTH, slice_chars)
    if not long:
        return encode(value)
    pieces = encode(skeleton).split(encode(placeholder))
    spelled = {id(text): (text, data) for text, data in plain}
    out = [pieces[0]]
    for text, after in zip(long, pieces[1:], strict=True):
        out.append(b'"')
        known = spelled.get(id(text))
        if known is not None and known[0] is text:
            out.append(known[1])
        else:
            out.extend(encode(piece)[1:-1] for piece in sliced(text, slice_chars))
        out.append(b'"')
        out.append(after)
    return b"".join(out)


def _swap_long_strings(
    value: Any, placeholder: str, long: list[str], depth: int, slice_chars: int
) -> Any:
    """`value` with strings over `slice_chars` (within `depth` levels) replaced by
    `placeholder`, collected into `long` in the order json.dumps writes them."""
    if isinstance(value, str):
        if len(value) > slice_chars:
            long.append(value)
            return placeholder
        return value
    if depth == 0:
        return value
    if isinstance(value, dict):
        return {
            key: _swap_long_strings(item, placeholder, long, depth - 1, slice_chars)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [
            _swap_long_strings(item, placeholder, long, depth - 1, slice_chars) for item in value
        ]
    return value

"""The sidecar's one JSON spelling, for every byte it hands a host or a provider; and the one
bounded parse of JSON it is handed by untrusted parties (:func:`bounded_loads`).

Key order is decided once, here: **keys stay in the order the value holds them**. Every object
the sidecar builds itself is built in a fixed order, and that order is chosen: a provider body
reads in the provider's cache-prefix order (tools, system, messages), a tool definition reads
name, description, schema. Data whose key order the sidecar does not choose — an MCP server's
input schema, a Spec's stored content — is passed through :func:`sorted_keys` first, so two
servers (or two sidecars) spelling the same schema differently give the same bytes.

No whitespace, UTF-8 (not ``\\u`` escapes: fewer bytes, and the estimator counts bytes), and
NaN/Infinity refused: they are not JSON, and a provider rejects a body holding them.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any, TypeVar

__all__ = [
    "MAX_JSON_DEPTH",
    "SLICE_CHARS",
    "JsonTooDeep",
    "b64encode_sliced",
    "bounded_loads",
    "canonical_json",
    "canonical_json_sliced",
    "sliced",
    "sorted_keys",
    "utf8_sliced",
]


def canonical_json(value: Any) -> bytes:
    """`value` as canonical JSON bytes (see the module docstring for the key order)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


# One C call over a string of tens of MB holds the GIL for tens of ms: every other thread,
# the event loop's included, waits that long. Strings longer than this are handled slice by
# slice, a fraction of a millisecond each, and the GIL is offered between slices.
SLICE_CHARS = 1 << 18
# How deep canonical_json_sliced looks for long strings: an MCP result's text sits at
# result → content → block → text; deeper data is encoded in one call as usual.
_SLICED_DEPTH = 4


Sliceable = TypeVar("Sliceable", str, bytes, memoryview)


def sliced(value: Sliceable, step: int) -> Iterator[Sliceable]:
    """`value` in consecutive slices of `step` items, the GIL offered after each (once the
    caller has handled the slice). Left to the interpreter, a thread that wants the GIL gets
    it only after the switch interval, and with several threads waiting not necessarily the
    event loop's: a loop waited 4-8 ms at a time beside a 50 MB result's encoding, ~0.5 ms
    with the offer."""
    for start in range(0, len(value), step):
        yield value[start : start + step]
        offer_gil()


def offer_gil() -> None:
    """Let any thread waiting for the GIL take it now (a zero sleep releases it)."""
    time.sleep(0)


def utf8_sliced(text: str) -> bytes:
    """`text.encode()`, a slice at a time when it is long (see SLICE_CHARS)."""
    if len(text) <= SLICE_CHARS:
        return text.encode()
    return b"".join(piece.encode() for piece in sliced(text, SLICE_CHARS))


def b64encode_sliced(data: bytes) -> str:
    """`base64.b64encode(data).decode()`, a slice at a time when it is long: one call over a
    37.5 MB image held the GIL ~60 ms to encode and ~30 ms to make the string. Every slice
    but the last is a whole number of 3-byte groups, so the pieces join to the whole's
    encoding; only their final join (a copy) is one call."""
    step = SLICE_CHARS // 4 * 3
    if len(data) <= step:
        return base64.b64encode(data).decode()
    return "".join(base64.b64encode(piece).decode() for piece in sliced(memoryview(data), step))


def canonical_json_sliced(value: Any) -> bytes:
    """canonical_json(value), the same bytes, for values that may carry very long strings
    near the top (an MCP tool result's text): each is escaped and encoded slice by slice,
    the rest in one call. Escaping is per character, so slices join to the whole string's
    escaping."""
    long: list[str] = []
    # Each long string is swapped for one placeholder no party can predict, found again in
    # the encoded skeleton (JSON spells the NULs as \u0000) and replaced in order.
    placeholder = f"\x00{secrets.token_hex(16)}\x00"
    skeleton = _swap_long_strings(value, placeholder, long, _SLICED_DEPTH)
    if not long:
        return canonical_json(value)
    pieces = canonical_json(skeleton).split(canonical_json(placeholder))
    out = [pieces[0]]
    for text, after in zip(long, pieces[1:], strict=True):
        out.append(b'"')
        out.extend(
            json.dumps(piece, ensure_ascii=False)[1:-1].encode()
            for piece in sliced(text, SLICE_CHARS)
        )
        out.append(b'"')
        out.append(after)
    return b"".join(out)


def _swap_long_strings(value: Any, placeholder: str, long: list[str], depth: int) -> Any:
    """`value` with strings over SLICE_CHARS (within `depth` levels) replaced by
    `placeholder`, collected into `long` in the order json.dumps writes them."""
    if isinstance(value, str):
        if len(value) > SLICE_CHARS:
            long.append(value)
            return placeholder
        return value
    if depth == 0:
        return value
    if isinstance(value, dict):
        return {
            key: _swap_long_strings(item, placeholder, long, depth - 1)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_swap_long_strings(item, placeholder, long, depth - 1) for item in value]
    return value


def sorted_keys(value: Any) -> Any:
    """The same JSON value with every object's keys sorted, at every depth."""
    if isinstance(value, dict):
        return {key: sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [sorted_keys(item) for item in value]
    return value


# Deeper than any tool schema or argument object a person writes; far below the recursion limit.
MAX_JSON_DEPTH = 64


class JsonTooDeep(ValueError):
    """The document nests objects and arrays deeper than MAX_JSON_DEPTH."""


def bounded_loads(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads for JSON from untrusted parties (a host's json parts, a model's tool
    arguments), refusing documents nested deeper than `max_depth` with JsonTooDeep — a
    ValueError, so callers that turn malformed JSON into a typed answer (FIELD_INVALID, a tool
    error) treat it alike. CPython's parser recurses per level: 100,000 levels would raise
    RecursionError, a few hundred parse but break whatever walks them. Size needs no bound
    here: every document arrived in a message already bounded by max_message_bytes."""
    if isinstance(text, bytes | bytearray):
        text = text.decode()
    # Counting brackets is C-speed: a document with fewer openers than the limit cannot be
    # too deep, and needs no walk.
    openers = text.count("[") + text.count("{")
    try:
        value = json.loads(text)
    except RecursionError:
        raise JsonTooDeep(f"nested deeper than {max_depth} levels") from None
    if openers > max_depth and _depth_exceeds(value, max_depth):
        raise JsonTooDeep(f"nested deeper than {max_depth} levels")
    return value


def _depth_exceeds(value: Any, max_depth: int) -> bool:
    """Whether containers nest deeper than max_depth; iterative, so any depth is safe."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth + 1 > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False

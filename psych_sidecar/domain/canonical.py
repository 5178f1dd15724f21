"""The sidecar's one JSON spelling, for every byte it hands a host or a provider; and the one
bounded parse of JSON it is handed by untrusted parties (:func:`bounded_loads`).

Key order is decided once, here: **keys stay in the order the value holds them**. Every object
the sidecar builds itself is built in a fixed order, and that order is chosen: a provider body
reads in the provider's cache-prefix order (tools, system, messages), a tool definition reads
name, description, schema. Data whose key order the sidecar does not choose — an MCP server's
input schema, a Spec's stored content — is passed through :func:`sorted_keys` first, so two
servers (or two sidecars) spelling the same schema differently give the same bytes.

No whitespace, UTF-8 (not ``\\u`` escapes: fewer bytes, and the estimator counts bytes), and
NaN/Infinity refused: they are not JSON, and a provider rejects a body holding them. A value
carrying texts of tens of MB is spelled the same, a slice at a time, by
``psych_sidecar.bulk.slices.json_sliced(value, canonical_json)``.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

__all__ = [
    "MAX_JSON_DEPTH",
    "JsonTooDeep",
    "Verbatim",
    "bounded_loads",
    "canonical_json",
    "sorted_keys",
]


class Verbatim:
    """JSON bytes someone else wrote (a provider's own block), to be spliced into a canonical
    document exactly as they are: not re-spelled, not reordered. The bytes must be JSON."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def canonical_json(value: Any) -> bytes:
    """`value` as canonical JSON bytes (see the module docstring for the key order); a
    :class:`Verbatim` anywhere in it is spliced in byte for byte."""
    held: list[bytes] = []
    # A placeholder no JSON string the value holds can spell: a fresh random tag per call.
    tag = secrets.token_hex(16)

    def hold(item: object) -> str:
        if not isinstance(item, Verbatim):
            raise TypeError(f"{type(item).__name__} is not JSON")
        held.append(item.data)
        return f"{tag}:{len(held) - 1}"

    text = json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=hold
    ).encode()
    if not held:
        return text
    pattern = re.compile(b'"' + tag.encode() + rb':(\d+)"')
    return pattern.sub(lambda match: held[int(match[1])], text)


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

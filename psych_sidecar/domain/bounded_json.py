"""JSON from untrusted parties (a host's json parts, a model's tool arguments, an MCP
server's schemas and results), parsed with a bound on nesting.

CPython's json parser recurses once per level: a document nested 100,000 deep raises
RecursionError, and one nested a few hundred deep parses but then breaks whatever walks it.
`loads` refuses both with `JsonTooDeep`, a ValueError, so every caller that already turns
malformed JSON into a typed answer (FIELD_INVALID for a host, a tool error for a model)
treats it the same way. Size needs no bound of its own here: every document arrived in a
request or an MCP message that is already bounded by `max_message_bytes`.
"""

from __future__ import annotations

import json
from typing import Any

# Deeper than any tool schema or argument object a person writes; far below the recursion limit.
MAX_JSON_DEPTH = 64


class JsonTooDeep(ValueError):
    """The document nests objects and arrays deeper than MAX_JSON_DEPTH."""


def loads(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, refusing documents nested deeper than `max_depth` (JsonTooDeep)."""
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

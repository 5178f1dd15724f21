"""The sidecar's one JSON spelling, for every byte it hands a host or a provider.

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

import json
from typing import Any

__all__ = ["canonical_json", "sorted_keys"]


def canonical_json(value: Any) -> bytes:
    """`value` as canonical JSON bytes (see the module docstring for the key order)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def sorted_keys(value: Any) -> Any:
    """The same JSON value with every object's keys sorted, at every depth."""
    if isinstance(value, dict):
        return {key: sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [sorted_keys(item) for item in value]
    return value

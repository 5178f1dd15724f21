"""A model's tool-call arguments, as it emitted them (a JSON text), read into an object."""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from psych_sidecar.domain.canonical import bounded_loads


class ArgumentError(Exception):
    """What is wrong with the arguments, as a clause the caller frames for the model."""


def parse_arguments(
    arguments_json: str,
    fields: Mapping[str, type[int] | type[str]] | None = None,
    required: Set[str] = frozenset(),
) -> dict[str, Any]:
    """The arguments as a JSON object (no text at all: no arguments), or an ArgumentError.
    With `fields` (a sidecar tool's own schema: name -> int or str), every argument must be
    one of them, of its type (integers not negative), and every `required` one present."""
    if not arguments_json.strip():
        value: Any = {}
    else:
        try:
            value = bounded_loads(arguments_json)
        except ValueError as error:
            raise ArgumentError(
                f"the arguments are not valid JSON ({error}); send a JSON object"
            ) from None
    if not isinstance(value, dict):
        raise ArgumentError("the arguments must be a JSON object")
    if fields is None:
        return value
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ArgumentError(f"unknown argument {unknown[0]!r}")
    for name in sorted(required):
        if name not in value:
            raise ArgumentError(f"{name!r} is required")
    for name, kind in fields.items():
        if name not in value:
            continue
        item = value[name]
        if kind is int and (isinstance(item, bool) or not isinstance(item, int)):
            raise ArgumentError(f"{name!r} must be an integer")
        if kind is int and item < 0:
            raise ArgumentError(f"{name!r} must not be negative")
        if kind is str and not isinstance(item, str):
            raise ArgumentError(f"{name!r} must be a string")
    return value

"""Checking a call's arguments against its MCP tool's input schema (and, for the MCP layer, a
result against the tool's output schema), with the validators cached per schema: checking a
schema costs more than using it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.calls.limits import MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP

# Keywords whose check runs a server's regular expression: its time has no bound worth the
# event loop's risk, whatever the size of the value.
_REGEX_KEYWORDS = frozenset({"pattern", "patternProperties"})


def json_within(value: Any, limit: int) -> bool:
    """Whether a JSON-like value holds at most `limit` characters (a limit of limits.py):
    stops counting as soon as it is over, so a large value costs no more than a small one."""
    stack = [value]
    left = limit
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            left -= len(item)
        elif isinstance(item, Mapping | list | tuple):
            # Every member counts at least one: a structure longer than what is left is over.
            left -= 1 + len(item)
            if left < 0:
                return False
            if isinstance(item, Mapping):
                left -= sum(len(key) for key in item if isinstance(key, str))
                stack.extend(item.values())
            else:
                stack.extend(item)
        else:
            left -= 1
        if left < 0:
            return False
    return True


def _has_key(value: Any, keys: frozenset[str]) -> bool:
    """Whether any object within a JSON value has one of `keys` (a property named so too:
    erring on the side of the worker thread)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if not keys.isdisjoint(item):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class SchemaValidators:
    """JSON Schema validators per schema, each built once: a tool's input schema for a call's
    arguments, and (in the MCP layer) its output schema for the server's result."""

    def __init__(self) -> None:
        # (validator, quick) or (None, True) for a schema that cannot be used; quick: no
        # keyword of the schema runs a regular expression.
        self._cache = ImmutableCache[bytes, tuple[Any, bool]](4096)

    def quick(self, schema_json: bytes, value: Any) -> bool:
        """Whether checking `value` against the schema is cheap enough for the event loop:
        the schema's validator is built (building one is not), the schema runs no regular
        expression and the value is small (MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP)."""
        cached = self._cache.get(schema_json)
        return (
            cached is not None
            and cached[1]
            and json_within(value, MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP)
        )

    def errors(self, schema_json: bytes, arguments: Mapping[str, Any]) -> list[str] | None:
        """The violations, or None when the server's schema itself is unusable (then the
        server judges the arguments)."""
        # Imported with the first check rather than with the sidecar (a twentieth of a start's
        # imports); later checks find them loaded.
        import jsonschema
        import jsonschema.exceptions
        import jsonschema.validators
        import referencing
        import referencing.exceptions

        cached = self._cache.get(schema_json)
        if cached is None:
            try:
                schema = json.loads(schema_json) if schema_json else {}
                cls = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
                cls.check_schema(schema)
                # Schemas come from MCP servers (untrusted): a `$ref` resolves within the schema
                # itself and the JSON Schema metaschemas, never over the network (jsonschema's
                # default registry fetches remote `$ref`s, with no timeout). An empty registry:
                # whatever else is unresolvable.
                cached = (
                    cls(schema, registry=referencing.Registry()),
                    not _has_key(schema, _REGEX_KEYWORDS),
                )
            except (ValueError, jsonschema.exceptions.SchemaError, TypeError):
                cached = (None, True)
            self._cache.put(schema_json, cached)
        validator = cached[0]
        if validator is None:
            return None
        try:
            found = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        except referencing.exceptions.Unresolvable as error:
            ref = getattr(error, "ref", "")
            return [
                f"(schema): the schema's $ref {ref[:200]!r} cannot be resolved (the "
                "sidecar resolves references within the schema only and never fetches one)"
            ]
        except jsonschema.exceptions.SchemaError:
            return None
        return [
            f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
            for error in found
        ]

"""Checking a call's arguments against its MCP tool's input schema (and, for the MCP layer, a
result against the tool's output schema), with the validators cached per schema: checking a
schema costs more than using it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from psych_sidecar.domain.cache import ImmutableCache


class SchemaValidators:
    """JSON Schema validators per schema, each built once: a tool's input schema for a call's
    arguments, and (in the MCP layer) its output schema for the server's result."""

    def __init__(self) -> None:
        # (validator,) or (None,) for a schema that cannot be used.
        self._cache = ImmutableCache[bytes, tuple[Any]](4096)

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
                cached = (cls(schema, registry=referencing.Registry()),)
            except (ValueError, jsonschema.exceptions.SchemaError, TypeError):
                cached = (None,)
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

"""Stored results as tool arguments: a model's call may put a reference where a value goes,
and the sidecar puts the value there before the MCP tool is called, so the data goes from
tool to tool without passing through the model's output.

A reference is an object whose only key is `$ref_output`, anywhere in a call's arguments:

    {"$ref_output": {"handle": "h_…"}}                     the whole result
    {"$ref_output": {"handle": "h_…", "part": 0}}          one part of what the model sees
    {"$ref_output": {"handle": "h_…", "query": "items[].id"}}  what a JMESPath query yields

The whole result is its JSON value when it is one JSON document (see `ToolOutputReader.json_of`)
and its text rendering (a string) otherwise. A part is its JSON value for a JSON part, its
text (a string) for a text part. Binary content is never an argument.

- The handle must be a result of the same Run: another Run's (or none) is
  INVALID_DEFERRED_HANDLE, raised, as for the reader; nothing is called or recorded.
- What the model can get wrong (a malformed reference, a bad query, binary or non-JSON content
  where JSON is needed, resolved arguments over `max_argument_bytes`) is a tool error.
- The log keeps the arguments as the model wrote them (its assistant message); the result
  records what each reference resolved to, by SHA-256 of its canonical JSON and its size, in
  the result's `_meta` (`RESOLVED_META_KEY`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from psych_sidecar.domain.calls import result_query
from psych_sidecar.domain.calls.outcomes import Asking, CallResult
from psych_sidecar.domain.calls.tool_output import ToolOutputReader, never_stop
from psych_sidecar.domain.canonical import canonical_json, sorted_keys
from psych_sidecar.domain.errors import FieldInvalid, PatternInvalid, PatternTooComplex
from psych_sidecar.domain.runlog import ByteRange, LogReader, PartKind, PartMeta, Run, model_view
from psych_sidecar.domain.surface import naming

RESOLVED_META_KEY = "psych-sidecar/resolved_references"
# At most this many references in one call's arguments.
MAX_REFERENCES = 16


class ReferenceProblem(Exception):
    """What is wrong with a reference, as a sentence for the model."""


@dataclass(frozen=True, slots=True)
class ResolvedReference:
    """What one reference became, as the log records it."""

    path: str
    handle: str
    query: str
    part: int | None
    sha256: str
    bytes: int

    def as_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "path": self.path,
            "handle": self.handle,
            "sha256": self.sha256,
            "bytes": self.bytes,
        }
        if self.query:
            meta["query"] = self.query
        if self.part is not None:
            meta["part"] = self.part
        return meta


@dataclass(frozen=True, slots=True)
class Resolution:
    arguments: dict[str, Any]
    references: tuple[ResolvedReference, ...]


def mentions_reference(arguments_json: str) -> bool:
    """A cheap test on the call's text: only calls that may hold a reference are walked."""
    return naming.REFERENCE_KEY in arguments_json


class ResultReferences:
    def __init__(self, reader: ToolOutputReader, log: LogReader, max_argument_bytes: int) -> None:
        self._reader = reader
        self._log = log
        self._max_bytes = max_argument_bytes

    def resolve(self, run: Run, arguments: dict[str, Any]) -> Resolution | ReferenceProblem:
        """The arguments with every reference replaced by its value (storage and CPU work: off
        the event loop). Raises INVALID_DEFERRED_HANDLE for a handle not of this Run."""
        resolved: list[ResolvedReference] = []
        try:
            value = self._walk(run, arguments, "", resolved)
        except ReferenceProblem as error:
            return error
        size = len(canonical_json(value))
        if size > self._max_bytes:
            return ReferenceProblem(
                f"The arguments with their references resolved are {size} bytes, more than the "
                f"{self._max_bytes} a tool call's arguments may be; pass less (a query can "
                "select or slice)."
            )
        return Resolution(value, tuple(resolved))

    def _walk(self, run: Run, value: Any, path: str, resolved: list[ResolvedReference]) -> Any:
        if isinstance(value, list):
            return [self._walk(run, item, f"{path}/{i}", resolved) for i, item in enumerate(value)]
        if not isinstance(value, dict):
            return value
        if naming.REFERENCE_KEY not in value:
            return {
                key: self._walk(run, item, f"{path}/{key}", resolved) for key, item in value.items()
            }
        if len(resolved) >= MAX_REFERENCES:
            raise ReferenceProblem(f"At most {MAX_REFERENCES} references may be in one call.")
        return self._one(run, value, path or "/", resolved)

    def _one(
        self, run: Run, wrapper: dict[str, Any], path: str, resolved: list[ResolvedReference]
    ) -> Any:
        spec = wrapper[naming.REFERENCE_KEY]
        where = f"The reference at {path}"
        if len(wrapper) != 1 or not isinstance(spec, dict):
            raise ReferenceProblem(
                f'{where} must be {{"{naming.REFERENCE_KEY}": {{"handle": …}}}} and nothing else.'
            )
        unknown = sorted(set(spec) - {"handle", "query", "part"})
        handle, query, part = spec.get("handle"), spec.get("query", ""), spec.get("part")
        if unknown:
            raise ReferenceProblem(f"{where} has an unknown field {unknown[0]!r}.")
        if not isinstance(handle, str) or not handle:
            raise ReferenceProblem(f"{where} needs a result's handle as `handle`.")
        if not isinstance(query, str):
            raise ReferenceProblem(f"{where}: `query` must be a string.")
        if part is not None and (isinstance(part, bool) or not isinstance(part, int) or part < 0):
            raise ReferenceProblem(f"{where}: `part` must be an integer >= 0.")
        if query and part is not None:
            raise ReferenceProblem(f"{where}: give `query` or `part`, not both.")
        # A handle not of this Run raises INVALID_DEFERRED_HANDLE here, as for the reader.
        sequence = self._reader.resolve(run, handle)
        metas = self._log.part_metas(run.run_id, [sequence]).get(sequence, [])
        try:
            if query:
                compiled = result_query.compile_query(query)
                value = result_query.evaluate_value(
                    compiled, self._reader.json_of(run.run_id, sequence, metas), never_stop
                )
            elif part is not None:
                value = self._part(run, sequence, metas, part, where)
            else:
                value = self._whole(run, handle, sequence, metas, where)
        except (PatternInvalid, PatternTooComplex, FieldInvalid) as error:
            raise ReferenceProblem(f"{where}: {error.field}: {error.detail}") from None
        data = canonical_json(value)
        resolved.append(
            ResolvedReference(
                path, handle, query, part, hashlib.sha256(data).hexdigest(), len(data)
            )
        )
        return value

    def _part(self, run: Run, sequence: int, metas: list[PartMeta], index: int, where: str) -> Any:
        shown = model_view(metas)
        if index >= len(shown):
            raise ReferenceProblem(f"{where}: the result has {len(shown)} parts; no part {index}.")
        part = shown[index]
        if part.kind is PartKind.BINARY:
            raise ReferenceProblem(f"{where}: part {index} is binary, which cannot be an argument.")
        self._check_size(part.byte_length, where)
        whole = ByteRange(sequence, part.index, 0, part.byte_length)
        (data,) = self._log.read_ranges(run.run_id, [whole])
        if part.kind is PartKind.JSON:
            return json.loads(data)
        return data.decode()

    def _whole(
        self, run: Run, handle: str, sequence: int, metas: list[PartMeta], where: str
    ) -> Any:
        shown = model_view(metas)
        if any(part.kind is PartKind.BINARY for part in shown):
            raise ReferenceProblem(
                f"{where}: the result holds binary content, which cannot be an "
                "argument; pass a text or JSON part with `part`."
            )
        self._check_size(sum(part.byte_length for part in shown), where)
        try:
            return self._reader.json_of(run.run_id, sequence, metas)
        except FieldInvalid:
            pass  # not one JSON document: its text
        read = self._reader.read(run, handle, 0, 0, "", self._max_bytes + 1)
        return read.text

    def _check_size(self, byte_length: int, where: str) -> None:
        if byte_length > self._max_bytes:
            raise ReferenceProblem(
                f"{where}: the result is {byte_length} bytes, more than the {self._max_bytes} a "
                "tool call's arguments may be; select less with `query`."
            )


def with_resolved_references(
    result: CallResult, references: tuple[ResolvedReference, ...]
) -> CallResult:
    """The result, its MCP JSON's `_meta` saying what each reference resolved to (by hash and
    size): recorded with it in the log. A call that asks for input first is left as it is."""
    if not references or isinstance(result, Asking):
        return result
    try:
        document = json.loads(result.result_json)
    except ValueError:
        return result
    if not isinstance(document, dict):
        return result
    meta = document.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta[RESOLVED_META_KEY] = [reference.as_meta() for reference in references]
    document["_meta"] = meta
    return dataclasses.replace(result, result_json=canonical_json(sorted_keys(document)))

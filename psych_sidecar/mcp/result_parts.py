"""MCP tools/call results as the sidecar's log parts, and judged against the tool's declared
output schema."""

from __future__ import annotations

import binascii
from typing import Any

import mcp_types as types
from pydantic import BaseModel

from psych_sidecar.bulk.slices import (
    SLICE_CHARS,
    b64decode_sliced,
    json_sliced,
    needs_no_json_escape,
)
from psych_sidecar.domain.calls import (
    MAX_RESULT_CHARS_CONVERTED_ON_LOOP,
    SchemaValidators,
    json_within,
)
from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.catalog import McpToolResult
from psych_sidecar.domain.runlog import ContentPart, PartKind

DEFAULT_BINARY_MIME_TYPE = "application/octet-stream"
# How much of the first violation of an output schema the tool error quotes.
MAX_OUTPUT_PROBLEM_CHARS = 300


def _dump(model: BaseModel) -> Any:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def _binary(data: str, mime_type: str | None, block: Any, slice_chars: int) -> ContentPart:
    try:
        decoded = b64decode_sliced(data, slice_chars=slice_chars)
    except (binascii.Error, ValueError):
        # Not base64 after all: keep exactly what the server sent, as JSON.
        return ContentPart(PartKind.JSON, json_sliced(_dump(block), canonical_json))
    return ContentPart(PartKind.BINARY, decoded, mime_type or DEFAULT_BINARY_MIME_TYPE)


def content_part(block: Any, *, slice_chars: int = SLICE_CHARS) -> ContentPart:
    """One MCP content block as a log part: text as text, images, audio and blobs as bytes
    with their MIME type, anything else (resource links, kinds this SDK does not know) as
    the block's JSON."""
    if isinstance(block, types.TextContent):
        return ContentPart.text(block.text)
    if isinstance(block, types.ImageContent | types.AudioContent):
        return _binary(block.data, block.mime_type, block, slice_chars)
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return ContentPart.text(resource.text)
        if isinstance(resource, types.BlobResourceContents):
            return _binary(resource.blob, resource.mime_type, block, slice_chars)
    return ContentPart(PartKind.JSON, canonical_json(_dump(block)))


def _parts(result: types.CallToolResult) -> list[ContentPart]:
    parts = [content_part(block) for block in result.content]
    if result.structured_content is not None:
        # Kept in the log, marked: the model's view shows it only when there is no text.
        parts.append(ContentPart.structured(canonical_json(result.structured_content)))
    return parts


def _plain_texts(result: types.CallToolResult, parts: list[ContentPart]) -> list[tuple[str, bytes]]:
    """The long texts of `result` paired with their parts' bytes where the result JSON can
    spell them as those bytes (nothing to escape): the JSON is then joined from the parts'
    bytes, not encoded from the texts a second time."""
    plain = []
    for block, part in zip(result.content, parts, strict=False):
        if isinstance(block, types.EmbeddedResource) and isinstance(
            block.resource, types.TextResourceContents
        ):
            text = block.resource.text
        elif isinstance(block, types.TextContent):
            text = block.text
        else:
            continue
        if len(text) > SLICE_CHARS and needs_no_json_escape(part.data):
            plain.append((text, part.data))
    return plain


def tool_result(result: types.CallToolResult) -> McpToolResult:
    parts = _parts(result)
    return McpToolResult(
        is_error=bool(result.is_error),
        # The whole result, its texts included: a result of tens of MB is encoded in slices
        # (this runs on a worker thread, and the event loop needs the GIL meanwhile), its
        # texts joined from their parts' bytes when they need no escaping.
        result_json=json_sliced(_dump(result), canonical_json, _plain_texts(result, parts)),
        content=tuple(parts),
    )


def _block_chars(block: Any) -> int | None:
    """A content block's characters, or None for a kind only its dump would size."""
    if isinstance(block, types.TextContent):
        return len(block.text)
    if isinstance(block, types.ImageContent | types.AudioContent):
        return len(block.data)
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return len(resource.text)
        if isinstance(resource, types.BlobResourceContents):
            return len(resource.blob)
    return None


def small_result(
    result: types.CallToolResult, limit: int = MAX_RESULT_CHARS_CONVERTED_ON_LOOP
) -> bool:
    """Whether a result holds at most `limit` characters, counted without converting it."""
    left = limit
    for block in result.content:
        size = _block_chars(block)
        if size is None:
            return False
        left -= size
        if left < 0 or (block.meta is not None and not json_within(block.meta, left)):
            return False
    return all(
        value is None or json_within(value, left)
        for value in (result.structured_content, result.meta)
    )


def output_schema_problem(
    validators: SchemaValidators, schema_json: bytes, result: types.CallToolResult
) -> str:
    """How a result breaks the tool's declared output schema (the first violation, cut
    short); "" when it does not, or when the schema is not one a validator can use (then
    there is nothing to hold the server to). Validated as arguments are: no `$ref` is ever
    fetched."""
    if not schema_json or result.is_error:
        return ""
    if result.structured_content is None:
        return "the tool declares an output schema and the result has no structuredContent"
    problems = validators.errors(schema_json, result.structured_content)
    if not problems:
        return ""
    return problems[0][:MAX_OUTPUT_PROBLEM_CHARS]


def schema_broken_result(result: types.CallToolResult, message: str) -> McpToolResult:
    """A result that broke its own output schema, as a tool error: `message` first, then
    everything the server sent, so the whole result is in the log and readable by handle."""
    dumped = _dump(result)
    dumped["content"] = [{"type": "text", "text": message}, *dumped.get("content", [])]
    dumped["isError"] = True
    parts = _parts(result)
    return McpToolResult(
        is_error=True,
        result_json=json_sliced(dumped, canonical_json, _plain_texts(result, parts)),
        content=(ContentPart.text(message), *parts),
    )

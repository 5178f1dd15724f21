"""The tools the sidecar itself owns and offers the model: read_tool_output, load_skill and
read_history.

Their definitions live here, in one place, so any tool surface (this release's, or one that
adds MCP tools) includes the same bytes. Schemas are canonical JSON (sorted keys, no
whitespace) and the order of tools is by name.
"""

from __future__ import annotations

from typing import Any

from psych_sidecar.bulk.slices import b64encode_sliced
from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.runlog import ContentPart, PartKind, Spec
from psych_sidecar.domain.surface.tiers import ExposedKind, ExposedTool, canonical_schema

READ_TOOL_OUTPUT = "read_tool_output"
LOAD_SKILL = "load_skill"
READ_HISTORY = "read_history"

# Reads for the model are kept small enough to land in the prompt whole: the model pages
# with offset rather than pulling a huge result into its context in one call.
MODEL_DEFAULT_LIMIT_CHARS = 8_000
MODEL_MAX_LIMIT_CHARS = 32_000
# A binary result is handed to the model whole (as an image, say) up to this size.
MODEL_MAX_BINARY_BYTES = 5 * 1024 * 1024
# How both reading tools page, in their descriptions.
_PAGED_READS = (
    f"At most {MODEL_MAX_LIMIT_CHARS} characters come back per call (default "
    f"{MODEL_DEFAULT_LIMIT_CHARS}); the result says where to continue."
)


_READ_TOOL_OUTPUT = ExposedTool(
    name=READ_TOOL_OUTPUT,
    description=(
        "Read a tool result from this conversation's log, in full or in part. Use it when a "
        "result was elided from the prompt: pass the handle shown with it. offset and limit "
        "count characters of the result's text; grep returns only the lines matching an RE2 "
        "pattern. Reading past the end, or a grep with no match, gives an empty result. "
        "On a JSON result, query takes a JMESPath expression and returns only what it yields, "
        "as JSON: items[?status=='open'].id filters and projects, length(items) counts. "
        + _PAGED_READS
    ),
    input_schema_json=canonical_schema(
        {
            "type": "object",
            "properties": {
                "handle": {
                    "type": "string",
                    "description": "The handle of the tool result, as shown with it.",
                },
                "offset": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Where to start, in characters from the beginning.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "At most this many characters (of matching lines, with grep).",
                },
                "grep": {
                    "type": "string",
                    "description": "An RE2 regular expression; only matching lines are "
                    "returned, with their line numbers.",
                },
                "query": {
                    "type": "string",
                    "description": "A JMESPath expression over the result's JSON; offset and "
                    "limit then page through what it yields. Not with grep.",
                },
            },
            "required": ["handle"],
            "additionalProperties": False,
        }
    ),
    kind=ExposedKind.READ_TOOL_OUTPUT,
)


_READ_HISTORY = ExposedTool(
    name=READ_HISTORY,
    description=(
        "Read the earlier part of this conversation that a summary replaced: every message "
        "and tool call is kept. turn reads one turn (1 is the first user message's), "
        "sequence reads on from a record's number; neither reads from the start. grep "
        "returns only the lines matching an RE2 pattern, with their record and turn. Tool "
        "results show their handle and first characters: read_tool_output reads them whole. "
        "Nothing there, or no match, gives an empty result. " + _PAGED_READS
    ),
    input_schema_json=canonical_schema(
        {
            "type": "object",
            "properties": {
                "turn": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Read this turn only. Not with sequence.",
                },
                "sequence": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Read from this record on. Not with turn.",
                },
                "grep": {
                    "type": "string",
                    "description": "An RE2 regular expression; only matching lines are returned.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "At most this many characters.",
                },
            },
            "additionalProperties": False,
        }
    ),
    kind=ExposedKind.READ_HISTORY,
)


def _load_skill(spec: Spec) -> ExposedTool:
    return ExposedTool(
        name=LOAD_SKILL,
        description=(
            "Load the full text of a skill listed in the Skills section of the system prompt. "
            "Load a skill before following it."
        ),
        input_schema_json=canonical_schema(
            {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "enum": sorted(skill.name for skill in spec.skills),
                        "description": "The skill's name.",
                    }
                },
                "required": ["name"],
                "additionalProperties": False,
            }
        ),
        kind=ExposedKind.LOAD_SKILL,
    )


def sidecar_tools(spec: Spec) -> tuple[ExposedTool, ...]:
    """The sidecar's own tools for a Run of this Spec, sorted by name. read_tool_output is
    always there (a tool that appeared only once something was elided would change the
    cached prefix); load_skill is there when the Spec has skills, read_history when it has a
    compaction policy. A Spec never changes, so
    neither does this list within a Run."""
    tools = [_READ_TOOL_OUTPUT]
    if spec.skills:
        tools.append(_load_skill(spec))
    if spec.compaction.enabled:
        tools.append(_READ_HISTORY)
    return tuple(sorted(tools, key=lambda tool: tool.name))


def mcp_result_json(
    content: tuple[ContentPart, ...], is_error: bool, source_handle: str = ""
) -> bytes:
    """The MCP CallToolResult JSON of a sidecar tool's result (ToolOutcome.result_json).
    Binary that is neither image nor audio becomes an embedded resource named after the
    handle it was read from."""
    blocks: list[dict[str, Any]] = []
    for part in content:
        if part.kind is not PartKind.BINARY:
            blocks.append({"type": "text", "text": part.as_text()})
            continue
        data = b64encode_sliced(part.data)
        if part.mime_type.startswith("image/"):
            blocks.append({"type": "image", "data": data, "mimeType": part.mime_type})
        elif part.mime_type.startswith("audio/"):
            blocks.append({"type": "audio", "data": data, "mimeType": part.mime_type})
        else:
            resource = {
                "uri": f"psych-sidecar://tool-output/{source_handle}",
                "mimeType": part.mime_type,
                "blob": data,
            }
            blocks.append({"type": "resource", "resource": resource})
    result = {"content": blocks, "isError": is_error}
    return canonical_json(result)

"""The OpenAI Responses API request body, which a host can send as is.

Canonical JSON like the other bodies (see domain/prompt/zones.py), in the same zone order:
`instructions` is zone 1, the first input item a developer message holding zone 2, then the
history as input items, then the transient text as a final user message. The history: a
user message each (text as `input_text`, images as `input_image`, PDFs as `input_file`), an
assistant message's content in order — its text as assistant messages, OpenAI's own blocks
(reasoning items above all) verbatim where they came, other providers' left out — then a
`function_call` item for each of its calls no block of its own spells, and each result as a
`function_call_output` item (a result that answers no call of the preceding assistant message
is shown as user text, as in the other bodies). Tools are function tools with `strict` false:
an MCP server's input schema is not written for strict mode, which would refuse it.

`prompt_cache_key` is the Chat Completions body's: one per tenant and Spec version.

Explicit cache breakpoints, on models that take them (`gpt-5.6` and later: `breakpoints_for`):
OpenAI matches a cached prefix only exactly at a breakpoint, considers the latest 80 of a
request's, and writes the latest three besides its implicit one. So `prompt_cache_breakpoint`
marks the end of zone 2 (its developer message is then a list of one `input_text`) and the end
of every call's history: the last block before each assistant message, and the last block of
the history. A block, once marked, stays marked on every later call (each call's history end
is the next one's step end), so each body stays a byte prefix of the next, and the first call
of a turn reads the previous turn's longest prefix still intact, as the Anthropic body's read
point does. Function results are then lists of one `input_text`, the block type that takes a
breakpoint; an assistant's items take none. Other models get no breakpoint: their cache is
automatic on the prefix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from psych_sidecar.bulk.slices import b64encode_sliced
from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.prompt.provider_compaction import since_compaction
from psych_sidecar.domain.prompt.providers import (
    IMAGE_TYPES,
    model_key,
    openai_tool_text,
    orphan_text,
    own_content,
    paired_results,
    rendered,
)
from psych_sidecar.domain.prompt.zones import Prompt, PromptMessage, Role
from psych_sidecar.domain.runlog import (
    ContentPart,
    PartKind,
    Provider,
    ReasoningEffort,
    ReasoningSettings,
    ToolCall,
    binary_marker,
)

# Marks the exact end of a reusable prefix (the Responses API's content blocks).
BREAKPOINT = {"mode": "explicit"}
# Model ids of the families that take explicit breakpoints: gpt-MAJOR[.MINOR][-variant].
_GPT = re.compile(r"gpt-(\d+)(?:\.(\d+))?(?:-|$)")


def breakpoints_for(model: str) -> bool:
    """Whether `model` takes explicit cache breakpoints: `gpt-5.6` and later (OpenAI's
    `prompt_cache_options`, docs/prompt.md). An id the sidecar does not recognise, or none,
    gets none: a field the model does not support would fail the request."""
    match = _GPT.match(model)
    if match is None:
        return False
    return (int(match.group(1)), int(match.group(2) or 0)) >= (5, 6)


def _input_content(part: ContentPart) -> dict[str, Any] | None:
    """A user message's part as Responses input content; None when it shows nothing."""
    if part.kind is PartKind.PROVIDER_BLOCK:
        return None  # assistant messages only
    if part.kind is not PartKind.BINARY:
        text = part.as_text()
        return {"type": "input_text", "text": text} if text else None
    url = f"data:{part.mime_type};base64,{b64encode_sliced(part.data)}"
    if part.mime_type in IMAGE_TYPES:
        return {"type": "input_image", "detail": "auto", "image_url": url}
    if part.mime_type == "application/pdf":
        return {"type": "input_file", "filename": "document.pdf", "file_data": url}
    return {"type": "input_text", "text": binary_marker(part.mime_type, len(part.data))}


def _user(content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": content}


def _assistant_text(part: ContentPart) -> dict[str, Any] | None:
    """An assistant message's part other than a provider block: its text, if any, as an
    assistant message of its own."""
    if part.kind is PartKind.BINARY or not part.data:
        return None
    return {"type": "message", "role": "assistant", "content": part.as_text()}


def _assistant_items(message: PromptMessage) -> list[Any]:
    """The message's content in order, then the calls no block of its own spells. When the
    host kept the response's `message` items too (as OpenAI asks: a reasoning item and the
    items after it form a group, sent back whole), they carry the text, and the record's
    text parts, there for the other providers, are left out."""
    items, spelled = own_content(message.parts, Provider.OPENAI, _assistant_text, "message")
    items.extend(
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments_json or "{}",
        }
        for call in message.parts
        if isinstance(call, ToolCall) and call.call_id not in spelled
    )
    return items


def _input_items(history: Sequence[PromptMessage], breakpoints: bool) -> list[Any]:
    """The history as input items; with `breakpoints`, the end of each call's history (the
    last block before each assistant message, and the history's last block) marked."""
    items: list[Any] = []
    calls: set[str] = set()
    # The last block of the items so far that takes a breakpoint.
    markable: dict[str, Any] | None = None
    for message in history:
        if message.role is Role.ASSISTANT:
            if breakpoints and markable is not None:
                markable["prompt_cache_breakpoint"] = BREAKPOINT
            items.extend(_assistant_items(message))
            calls = {c.call_id for c in message.parts if isinstance(c, ToolCall)}
        elif message.is_tool_results:
            paired, orphans = paired_results(message, calls)
            for r in paired:
                output: Any = openai_tool_text(r)
                if breakpoints:
                    markable = {"type": "input_text", "text": output}
                    output = [markable]
                items.append(
                    {"type": "function_call_output", "call_id": r.call_id, "output": output}
                )
            if orphans:
                content = [{"type": "input_text", "text": orphan_text(r)} for r in orphans]
                markable = content[-1]
                items.append(_user(content))
            calls = set()
        else:
            content = rendered(message.parts, _input_content)
            calls = set()
            if content:
                markable = content[-1]
                items.append(_user(content))
    if breakpoints and markable is not None:
        markable["prompt_cache_breakpoint"] = BREAKPOINT
    return items


def openai_responses_body(
    prompt: Prompt,
    model: str,
    max_tokens: int,
    prompt_cache_key: str,
    reasoning: ReasoningSettings,
) -> bytes:
    body: dict[str, Any] = model_key(model)
    body["max_output_tokens"] = max_tokens
    body["prompt_cache_key"] = prompt_cache_key
    effort = reasoning.openai_reasoning_effort
    if effort is not None:
        body["reasoning"] = {"effort": effort.value}
        if effort is not ReasoningEffort.NONE:
            # Reasoning items come back with their encrypted content, so that they can be sent
            # back whether or not OpenAI stores the response.
            body["include"] = ["reasoning.encrypted_content"]
    if prompt.provider_compaction is not None:
        body["context_management"] = prompt.provider_compaction.openai_context_management()
    if prompt.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": json.loads(tool.input_schema_json),
                "strict": False,
            }
            for tool in prompt.tools
        ]
        calling = prompt.programmatic_calling
        if calling.enabled:
            # Callable from programs in OpenAI's hosted runtime, whose tool comes first.
            for tool_definition in body["tools"]:
                tool_definition["allowed_callers"] = calling.openai_allowed_callers()
            body["tools"].insert(0, calling.openai_sandbox_tool())
    if prompt.static_sections:
        body["instructions"] = prompt.static_text()
    breakpoints = breakpoints_for(model)
    items: list[Any] = []
    if prompt.dynamic_tail:
        tail: Any = prompt.dynamic_tail
        if breakpoints:
            tail = [{"type": "input_text", "text": tail, "prompt_cache_breakpoint": BREAKPOINT}]
        items.append({"type": "message", "role": "developer", "content": tail})
    # From the latest compaction item on, as OpenAI allows (provider_compaction.py).
    items.extend(_input_items(since_compaction(prompt.history, Provider.OPENAI), breakpoints))
    items.append(_user(rendered(prompt.transient.parts, _input_content)))
    body["input"] = items
    return canonical_json(body)

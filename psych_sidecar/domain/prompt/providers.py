"""Provider request bodies a host can send as is: Anthropic Messages, OpenAI Chat Completions.

Both are canonical JSON (see domain/prompt/zones.py): the same prompt always gives the same bytes.

Anthropic: tools, then system blocks (zone 1, then zone 2), then messages, which is the
order its prompt cache reads them. One `cache_control` breakpoint closes each cached zone:
on the zone 1 system block (on the last tool when there is none), on the zone 2 block, and
on the last block of the history; the fourth is the read point (`read_point`): where the
longest prefix the previous turn cached ends, so the first call of a turn reads it even
when that is more than 20 blocks before the end (Anthropic's lookback). The transient text
(zone 4) is the last block of the last user message, after any tool results.

OpenAI: one system message per system zone, the history with assistant `tool_calls` and
role "tool" results, then the transient note as a final user message. Its prompt cache is
automatic on the prefix, so the same zone order is most of what it needs; `prompt_cache_key`
(`cache_key`) routes every call of a tenant's Runs of one Spec version to the same cache, as
OpenAI documents for requests that share long prefixes (docs/prompt.md).

Content neither API can take as it is becomes a text marker, never decoded bytes; tool
results that answer no call of the preceding assistant message (or answer one twice) are
shown as text, so the request stays valid.

Provider blocks (a reasoning model's thinking and the like, see runlog/provider_blocks.py) go
back into their own provider's body byte for byte, at their place among the assistant
message's content, and are left out of every other body. A block that spells a tool call
(its envelope's `call_id`) is sent instead of the body's own rendering of that call. Which
blocks each provider keeps, with the provider's documented rule, is in docs/prompt.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from psych_sidecar.bulk.slices import b64encode_sliced
from psych_sidecar.domain.canonical import Verbatim, bounded_loads, canonical_json
from psych_sidecar.domain.prompt.provider_compaction import since_compaction
from psych_sidecar.domain.prompt.zones import (
    Prompt,
    PromptMessage,
    PromptPart,
    Role,
    ToolResultView,
)
from psych_sidecar.domain.runlog import (
    AnthropicThinking,
    ContentPart,
    PartKind,
    Provider,
    ReasoningSettings,
    ToolCall,
    binary_marker,
)

T = TypeVar("T")

CACHE_CONTROL = {"type": "ephemeral"}
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


def model_key(model: str) -> dict[str, Any]:
    """The body's first key: the model id, or nothing when the host sent none (the host
    then sets it; an empty string is never a model a provider accepts)."""
    return {"model": model} if model else {}


def own_content(
    parts: Sequence[PromptPart],
    provider: Provider,
    render: Callable[[ContentPart], Any | None],
    text_block: str = "",
) -> tuple[list[Any], set[str]]:
    """An assistant message's content for `provider`'s body, in order: its own blocks as
    Verbatim, other providers' left out, the rest through `render` (None: left out); and the
    calls its own blocks spell. When a block of `provider` of type `text_block` is there, it
    carries the response's text in that provider's own spelling (OpenAI's `message` item,
    Gemini's signed `text` part): the body sends it, and not the record's other parts."""
    with_text = not text_block or not any(
        isinstance(p, ContentPart)
        and p.kind is PartKind.PROVIDER_BLOCK
        and p.envelope.provider is provider
        and p.envelope.block_type == text_block
        for p in parts
    )
    kept: list[Any] = []
    spelled: set[str] = set()
    for part in parts:
        if not isinstance(part, ContentPart):
            continue
        if part.kind is PartKind.PROVIDER_BLOCK:
            envelope = part.envelope
            if envelope.provider is provider:
                kept.append(Verbatim(part.data))
                if envelope.call_id:
                    spelled.add(envelope.call_id)
        elif with_text and (shown := render(part)) is not None:
            kept.append(shown)
    return kept, spelled


def rendered(parts: Sequence[PromptPart], render: Callable[[ContentPart], T | None]) -> list[T]:
    """The content parts among `parts` through `render`, those it shows nothing for left out."""
    return [
        block
        for part in parts
        if isinstance(part, ContentPart) and (block := render(part)) is not None
    ]


def _mark(blocks: list[Any]) -> None:
    """A cache breakpoint on the last block the sidecar wrote itself: a provider's own block
    is sent as it came, and Anthropic takes no cache_control on a thinking block."""
    for block in reversed(blocks):
        if isinstance(block, dict):
            block["cache_control"] = CACHE_CONTROL
            return


def content_text(parts: Sequence[ContentPart]) -> str:
    """Parts as plain text: text and JSON as they are, binary as its marker, one per line."""
    return "\n".join(
        binary_marker(p.mime_type, len(p.data)) if p.kind is PartKind.BINARY else p.as_text()
        for p in parts
    )


def orphan_text(result: ToolResultView) -> str:
    label = "Error result" if result.is_error else "Result"
    return f"[{label} of tool call {result.call_id}]\n{content_text(result.content)}"


def tool_arguments(call: ToolCall) -> dict[str, Any]:
    """Anthropic needs an object; arguments that are not one are kept verbatim inside one."""
    if not call.arguments_json.strip():
        return {}
    try:
        value = bounded_loads(call.arguments_json)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    return {"invalid_arguments_json": call.arguments_json}


def paired_results(
    message: PromptMessage, calls: set[str]
) -> tuple[list[ToolResultView], list[ToolResultView]]:
    """Split a tool-results message's results into those answering a call of the preceding
    assistant message (once each) and the rest."""
    paired, orphans, seen = [], [], set()
    for result in message.parts:
        if not isinstance(result, ToolResultView):
            continue
        if result.call_id in calls and result.call_id not in seen:
            seen.add(result.call_id)
            paired.append(result)
        else:
            orphans.append(result)
    return paired, orphans


# Anthropic Messages


def _anthropic_content(part: ContentPart) -> dict[str, Any] | None:
    if part.kind is PartKind.PROVIDER_BLOCK:
        return None  # placed by _anthropic_assistant, in assistant messages only
    if part.kind is not PartKind.BINARY:
        text = part.as_text()
        return {"type": "text", "text": text} if text else None
    data = b64encode_sliced(part.data)
    if part.mime_type in IMAGE_TYPES:
        source = {"type": "base64", "media_type": part.mime_type, "data": data}
        return {"type": "image", "source": source}
    if part.mime_type == "application/pdf":
        source = {"type": "base64", "media_type": part.mime_type, "data": data}
        return {"type": "document", "source": source}
    return {"type": "text", "text": binary_marker(part.mime_type, len(part.data))}


def _anthropic_assistant(message: PromptMessage) -> list[Any]:
    """An assistant message's blocks: its content in order (Anthropic's own blocks verbatim),
    then a tool_use block for each call no block of its own spells."""
    blocks, spelled = own_content(message.parts, Provider.ANTHROPIC, _anthropic_content)
    blocks.extend(
        {"type": "tool_use", "id": c.call_id, "name": c.name, "input": tool_arguments(c)}
        for c in message.parts
        if isinstance(c, ToolCall) and c.call_id not in spelled
    )
    return blocks


def _anthropic_tool_result(result: ToolResultView) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": result.call_id}
    content = rendered(result.content, _anthropic_content)
    if content:
        block["content"] = content
    if result.is_error:
        block["is_error"] = True
    return block


def read_point(history: Sequence[PromptMessage]) -> int:
    """The history message after which the first call of this turn can read the previous
    turn's cache, or -1.

    Each call of the previous turn wrote the cache up to the end of its history, which is the
    message just before the assistant message it produced. At this turn's boundary the
    previous turn's results flip to their elided views; the prefix is unchanged up to the
    first one that flipped, so the longest prefix still cached ends just before the last
    assistant message that precedes it (before the previous turn's last assistant message
    when nothing flipped)."""
    users = [i for i, m in enumerate(history) if m.role is Role.USER and not m.is_tool_results]
    if len(users) < 2:
        return -1
    start, end = users[-2], users[-1]
    answer = -1
    for index in range(start + 1, end):
        message = history[index]
        if message.role is Role.ASSISTANT:
            answer = index
        elif any(isinstance(p, ToolResultView) and p.elided for p in message.parts):
            break
    return answer - 1 if answer > 0 else -1


def _anthropic_messages(history: Sequence[PromptMessage], mark: int = -1) -> list[dict[str, Any]]:
    """The history as Messages API messages; the last block that history[mark] yields gets
    a cache breakpoint."""
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    for position, message in enumerate(history):
        if position == mark + 1 and mark >= 0 and messages:
            _mark(messages[-1]["content"])
        blocks: list[Any] = []
        if message.role is Role.ASSISTANT:
            blocks = _anthropic_assistant(message)
            calls = {c.call_id for c in message.parts if isinstance(c, ToolCall)}
        elif message.is_tool_results:
            paired, orphans = paired_results(message, calls)
            blocks = [_anthropic_tool_result(r) for r in paired]
            blocks.extend({"type": "text", "text": orphan_text(r)} for r in orphans)
            calls = set()
        else:
            blocks = rendered(message.parts, _anthropic_content)
            calls = set()
        if not blocks:
            continue
        if messages and messages[-1]["role"] == message.role.value:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": message.role.value, "content": blocks})
    return messages


def _thinking(reasoning: ReasoningSettings) -> dict[str, Any] | None:
    """Anthropic's `thinking` parameter, or None to leave it out."""
    if reasoning.anthropic_thinking is None:
        return None
    thinking: dict[str, Any] = {"type": reasoning.anthropic_thinking.value}
    if reasoning.anthropic_thinking is AnthropicThinking.ENABLED:
        thinking["budget_tokens"] = reasoning.anthropic_budget_tokens
    return thinking


def anthropic_body(
    prompt: Prompt, model: str, max_tokens: int, reasoning: ReasoningSettings
) -> bytes:
    tools: list[dict[str, Any]] = [
        {
            "name": tool.name,
            "description": tool.description,
            "input_schema": json.loads(tool.input_schema_json),
        }
        for tool in prompt.tools
    ]
    calling = prompt.programmatic_calling
    if calling.enabled and tools:
        # Callable from the code execution tool's sandbox, which comes first among the tools.
        for tool_definition in tools:
            tool_definition["allowed_callers"] = calling.anthropic_allowed_callers()
        tools.insert(0, calling.anthropic_sandbox_tool())
    system: list[dict[str, Any]] = []
    if prompt.static_sections:
        system.append(
            {"type": "text", "text": prompt.static_text(), "cache_control": CACHE_CONTROL}
        )
    elif tools:
        tools[-1]["cache_control"] = CACHE_CONTROL
    if prompt.dynamic_tail:
        system.append({"type": "text", "text": prompt.dynamic_tail, "cache_control": CACHE_CONTROL})
    # From the latest compaction block on, as Anthropic reads it (provider_compaction.py).
    history = since_compaction(prompt.history, Provider.ANTHROPIC)
    messages = _anthropic_messages(history, read_point(history))
    if messages:
        _mark(messages[-1]["content"])
    transient = rendered(prompt.transient.parts, _anthropic_content)
    if messages and messages[-1]["role"] == Role.USER.value:
        messages[-1]["content"].extend(transient)
    else:
        messages.append({"role": Role.USER.value, "content": transient})
    body: dict[str, Any] = model_key(model)
    body["max_tokens"] = max_tokens
    thinking = _thinking(reasoning)
    if thinking is not None:
        body["thinking"] = thinking
    if prompt.provider_compaction is not None:
        body["context_management"] = prompt.provider_compaction.anthropic_context_management()
    if tools:
        body["tools"] = tools
    if system:
        body["system"] = system
    body["messages"] = messages
    return canonical_json(body)


# OpenAI Chat Completions


def _openai_content(part: ContentPart) -> dict[str, Any] | None:
    if part.kind is PartKind.PROVIDER_BLOCK:
        return None  # Chat Completions has no place for one
    if part.kind is not PartKind.BINARY:
        text = part.as_text()
        return {"type": "text", "text": text} if text else None
    if part.mime_type in IMAGE_TYPES:
        url = f"data:{part.mime_type};base64,{b64encode_sliced(part.data)}"
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "text", "text": binary_marker(part.mime_type, len(part.data))}


def openai_tool_text(result: ToolResultView) -> str:
    text = content_text(result.content)
    return f"[error] {text}" if result.is_error else text


_TEXTUAL = frozenset({PartKind.TEXT, PartKind.JSON})


def _openai_messages(history: Sequence[PromptMessage]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    for message in history:
        if message.role is Role.ASSISTANT:
            texts = [
                {"type": "text", "text": p.as_text()}
                for p in message.parts
                if isinstance(p, ContentPart) and p.kind in _TEXTUAL and p.data
            ]
            tool_calls = [p for p in message.parts if isinstance(p, ToolCall)]
            calls = {c.call_id for c in tool_calls}
            if not texts and not tool_calls:
                continue
            entry: dict[str, Any] = {"role": "assistant", "content": texts or None}
            if tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments_json or "{}"},
                    }
                    for c in tool_calls
                ]
            messages.append(entry)
        elif message.is_tool_results:
            paired, orphans = paired_results(message, calls)
            messages.extend(
                {"role": "tool", "tool_call_id": r.call_id, "content": openai_tool_text(r)}
                for r in paired
            )
            if orphans:
                content = [{"type": "text", "text": orphan_text(r)} for r in orphans]
                messages.append({"role": "user", "content": content})
            calls = set()
        else:
            content = rendered(message.parts, _openai_content)
            calls = set()
            if content:
                messages.append({"role": "user", "content": content})
    return messages


def cache_key(tenant: str, spec_name: str, spec_version: int) -> str:
    """OpenAI's `prompt_cache_key` for a tenant's Runs of one Spec version: stable, so that
    their requests (which share zone 1 and usually zone 2) are routed to the same cache,
    and a digest, so that no tenant or Spec name is sent to the provider."""
    identity = json.dumps([tenant, spec_name, spec_version]).encode()
    return "psych-" + hashlib.sha256(identity).hexdigest()[:32]


def openai_body(
    prompt: Prompt,
    model: str,
    max_tokens: int,
    prompt_cache_key: str,
    reasoning: ReasoningSettings,
) -> bytes:
    messages: list[dict[str, Any]] = []
    if prompt.static_sections:
        messages.append({"role": "system", "content": prompt.static_text()})
    if prompt.dynamic_tail:
        messages.append({"role": "system", "content": prompt.dynamic_tail})
    messages.extend(_openai_messages(prompt.history))
    messages.append({"role": "user", "content": rendered(prompt.transient.parts, _openai_content)})
    body: dict[str, Any] = model_key(model)
    body["max_completion_tokens"] = max_tokens
    if reasoning.openai_reasoning_effort is not None:
        body["reasoning_effort"] = reasoning.openai_reasoning_effort.value
    body["prompt_cache_key"] = prompt_cache_key
    if prompt.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": json.loads(tool.input_schema_json),
                },
            }
            for tool in prompt.tools
        ]
    body["messages"] = messages
    return canonical_json(body)

"""The Gemini API request body (`generateContent`), which a host can send as is.

Canonical JSON like the other bodies (see domain/prompt/zones.py). The model is not in it: Gemini
names the model in the request's URL. Key order `generationConfig, tools, systemInstruction,
contents`, so that, as in every body, what changes least comes first and each call's body is
a byte prefix of the next but for the trailing transient text. Gemini's implicit cache reads
the prompt's common prefix (tools and the system instruction, then the contents), so the same
zone order keeps it hitting: zone 1 and zone 2 are the system instruction's two text parts,
the history is `contents`, and the transient text is the last part of the last user content.

The history: user content (text parts, images and PDFs as `inlineData`, anything else the
marker text); model content in order — its text parts, Gemini's own blocks (thought parts and
parts carrying a `thoughtSignature`) verbatim where they came, other providers' left out —
then a `functionCall` part for each call no block of its own spells; each result a
`functionResponse` part named after its call (`{"output": text}`, or `{"error": text}` for a
failure), a result that answers no call of the preceding model content shown as user text.
Function declarations carry the tool's JSON Schema as `parametersJsonSchema` (Gemini's
`parameters` takes only an OpenAPI subset a server's schema may not fit).

A model content whose calls no Gemini block spells (its calls come from another provider, or
the host kept no signature) has no thought signature, which Gemini 3 refuses for the calls of
the current turn; its first `functionCall` part then carries the placeholder signature Gemini
documents for calls it did not produce (`skip_thought_signature_validator`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from psych_sidecar.bulk.slices import b64encode_sliced
from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.prompt.providers import (
    IMAGE_TYPES,
    content_text,
    orphan_text,
    own_content,
    paired_results,
    rendered,
    tool_arguments,
)
from psych_sidecar.domain.prompt.zones import Prompt, PromptMessage, Role, ToolResultView
from psych_sidecar.domain.runlog import (
    ContentPart,
    PartKind,
    Provider,
    ReasoningSettings,
    ToolCall,
    binary_marker,
)

# Gemini's documented placeholder for a function call that carries no signature of its own.
PLACEHOLDER_SIGNATURE = "skip_thought_signature_validator"
INLINE_TYPES = IMAGE_TYPES | {"application/pdf"}


def _user_part(part: ContentPart) -> dict[str, Any] | None:
    if part.kind is PartKind.PROVIDER_BLOCK:
        return None  # model content only
    if part.kind is not PartKind.BINARY:
        text = part.as_text()
        return {"text": text} if text else None
    if part.mime_type in INLINE_TYPES:
        data = b64encode_sliced(part.data)
        return {"inlineData": {"mimeType": part.mime_type, "data": data}}
    return {"text": binary_marker(part.mime_type, len(part.data))}


def _model_text(part: ContentPart) -> dict[str, Any] | None:
    """A model content's part other than a provider block: its text, if any."""
    return {"text": part.as_text()} if part.kind is not PartKind.BINARY and part.data else None


def _model_parts(message: PromptMessage) -> list[Any]:
    parts, spelled = own_content(message.parts, Provider.GEMINI, _model_text, "text")
    calls = [c for c in message.parts if isinstance(c, ToolCall) and c.call_id not in spelled]
    for index, call in enumerate(calls):
        rendered: dict[str, Any] = {
            "functionCall": {"name": call.name, "args": tool_arguments(call)}
        }
        if index == 0 and not spelled:
            rendered["thoughtSignature"] = PLACEHOLDER_SIGNATURE
        parts.append(rendered)
    return parts


def _response(result: ToolResultView, name: str) -> dict[str, Any]:
    key = "error" if result.is_error else "output"
    return {"functionResponse": {"name": name, "response": {key: content_text(result.content)}}}


def _contents(history: Sequence[PromptMessage]) -> list[dict[str, Any]]:
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # the calls of the preceding model content, by call id
    for message in history:
        if message.role is Role.ASSISTANT:
            role, parts = "model", _model_parts(message)
            names = {c.call_id: c.name for c in message.parts if isinstance(c, ToolCall)}
        elif message.is_tool_results:
            paired, orphans = paired_results(message, set(names))
            role = "user"
            parts = [_response(r, names[r.call_id]) for r in paired]
            parts.extend({"text": orphan_text(r)} for r in orphans)
            names = {}
        else:
            role = "user"
            parts = rendered(message.parts, _user_part)
            names = {}
        if not parts:
            continue
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    return contents


def _thinking_config(reasoning: ReasoningSettings) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if reasoning.gemini_thinking_budget is not None:
        config["thinkingBudget"] = reasoning.gemini_thinking_budget
    if reasoning.gemini_thinking_level is not None:
        config["thinkingLevel"] = reasoning.gemini_thinking_level.value
    if reasoning.gemini_include_thoughts is not None:
        config["includeThoughts"] = reasoning.gemini_include_thoughts
    return config


def gemini_body(prompt: Prompt, max_tokens: int, reasoning: ReasoningSettings) -> bytes:
    generation: dict[str, Any] = {"maxOutputTokens": max_tokens}
    thinking = _thinking_config(reasoning)
    if thinking:
        generation["thinkingConfig"] = thinking
    body: dict[str, Any] = {"generationConfig": generation}
    if prompt.tools:
        declarations = [
            {
                "name": tool.name,
                "description": tool.description,
                "parametersJsonSchema": json.loads(tool.input_schema_json),
            }
            for tool in prompt.tools
        ]
        body["tools"] = [{"functionDeclarations": declarations}]
    system = [{"text": text} for text in (prompt.static_text(), prompt.dynamic_tail) if text]
    if system:
        body["systemInstruction"] = {"parts": system}
    contents = _contents(prompt.history)
    transient = rendered(prompt.transient.parts, _user_part)
    if contents and contents[-1]["role"] == "user":
        contents[-1]["parts"].extend(transient)
    else:
        contents.append({"role": "user", "parts": transient})
    body["contents"] = contents
    return canonical_json(body)

"""A reasoning model's response as the assistant record a host appends, and the body to send.

Each provider's API needs some of its response back exactly as it sent it (docs/prompt.md,
"Provider blocks"). These functions take a response as parsed from the provider's JSON (or
an SDK object's `model_dump(mode="json", by_alias=True, exclude_none=True)`) and keep those
blocks as provider blocks of the assistant record, beside the text and tool calls every
provider's body shows. Each block is kept as the JSON of the value received.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from psych.sidecar.v1 import content_pb2, run_pb2, turn_service_pb2

# Anthropic blocks that go back as they came: thinking, and server tools' calls and results
# (every `*_tool_result` block: web search and fetch, code execution, tool search).
# The compaction block is the provider's own compaction's (docs/prompt.md).
_ANTHROPIC_KEPT = frozenset({"thinking", "redacted_thinking", "server_tool_use", "compaction"})
_BODIES = {
    content_pb2.PROVIDER_ANTHROPIC: "anthropic_request_json",
    content_pb2.PROVIDER_OPENAI: "openai_responses_request_json",
    content_pb2.PROVIDER_GEMINI: "gemini_request_json",
}


def _block(
    provider: content_pb2.Provider.ValueType,
    value: Mapping[str, Any],
    block_type: str,
    call_id: str = "",
) -> content_pb2.ContentPart:
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    block = content_pb2.ProviderBlock(
        provider=provider, type=block_type, json=data, call_id=call_id
    )
    return content_pb2.ContentPart(provider_block=block)


def _record(
    content: Iterable[content_pb2.ContentPart], calls: Iterable[content_pb2.ToolCall]
) -> run_pb2.Record:
    message = run_pb2.AssistantMessage(content=list(content), tool_calls=list(calls))
    return run_pb2.Record(assistant_message=message)


def anthropic_record(message: Mapping[str, Any]) -> run_pb2.Record:
    """A Messages API response: thinking, redacted_thinking, server-tool and compaction
    blocks kept in place, text as text parts, tool_use blocks as tool calls. A tool_use
    made by code in the code execution sandbox (programmatic tool calling: its `caller` is
    not "direct") is kept too, linked to its call, so that it goes back with its caller."""
    content: list[content_pb2.ContentPart] = []
    calls: list[content_pb2.ToolCall] = []
    for block in message["content"]:
        kind = block["type"]
        if kind in _ANTHROPIC_KEPT or kind.endswith("_tool_result"):
            content.append(_block(content_pb2.PROVIDER_ANTHROPIC, block, kind))
        elif kind == "text":
            content.append(content_pb2.ContentPart(text=block["text"]))
        elif kind == "tool_use":
            arguments = json.dumps(block["input"], ensure_ascii=False)
            calls.append(
                content_pb2.ToolCall(
                    call_id=block["id"], name=block["name"], arguments_json=arguments
                )
            )
            caller = block.get("caller") or {"type": "direct"}
            if caller.get("type") != "direct":
                content.append(_block(content_pb2.PROVIDER_ANTHROPIC, block, kind, block["id"]))
    return _record(content, calls)


def openai_record(response: Mapping[str, Any]) -> run_pb2.Record:
    """A Responses API response: every output item kept in order (a reasoning item and the
    items after it go back together, as OpenAI checks), message text also as text parts,
    function_call items also as tool calls (the item linked to its call by call_id)."""
    content: list[content_pb2.ContentPart] = []
    calls: list[content_pb2.ToolCall] = []
    for item in response["output"]:
        call_id = ""
        if item["type"] == "message":
            content.extend(
                content_pb2.ContentPart(text=part["text"])
                for part in item.get("content", [])
                if part.get("type") == "output_text" and part.get("text")
            )
        elif item["type"] == "function_call":
            call_id = item["call_id"]
            calls.append(
                content_pb2.ToolCall(
                    call_id=call_id, name=item["name"], arguments_json=item["arguments"]
                )
            )
        content.append(_block(content_pb2.PROVIDER_OPENAI, item, item["type"], call_id))
    return _record(content, calls)


def gemini_record(response: Mapping[str, Any], call_ids: Sequence[str]) -> run_pb2.Record:
    """A generateContent response's first candidate: thought parts and parts carrying a
    thoughtSignature kept in place (a signed functionCall linked to its call, a signed text
    part as type "text"), text as text parts, function calls as tool calls with the ids the
    host gives them (`call_ids`, one per functionCall, in order)."""
    if sum("functionCall" in p for p in response["candidates"][0]["content"]["parts"]) != len(
        call_ids
    ):
        raise ValueError("call_ids must name every functionCall of the response, in order")
    content: list[content_pb2.ContentPart] = []
    calls: list[content_pb2.ToolCall] = []
    ids = iter(call_ids)
    for part in response["candidates"][0]["content"]["parts"]:
        call_id = ""
        if "functionCall" in part:
            call = part["functionCall"]
            call_id = next(ids)
            arguments = json.dumps(call.get("args", {}), ensure_ascii=False)
            calls.append(
                content_pb2.ToolCall(call_id=call_id, name=call["name"], arguments_json=arguments)
            )
        elif "text" in part and not part.get("thought"):
            content.append(content_pb2.ContentPart(text=part["text"]))
        if "thoughtSignature" in part or part.get("thought"):
            kind = "thought" if part.get("thought") else "functionCall" if call_id else "text"
            content.append(_block(content_pb2.PROVIDER_GEMINI, part, kind, call_id))
    return _record(content, calls)


def request_body(
    assembled: turn_service_pb2.AssemblePromptResponse,
    provider: content_pb2.Provider.ValueType,
) -> bytes:
    """The body to send to `provider`: Anthropic Messages, OpenAI Responses or Gemini
    generateContent (the Chat Completions body, `openai_request_json`, carries no reasoning
    items). Empty when the request's `bodies` did not ask for it."""
    return bytes(getattr(assembled, _BODIES[provider]))

"""A host's side of a reasoning model's tool loop: provider responses, in each provider's
documented response shape, turned into the assistant records a host appends, keeping every
block the provider needs back as a provider block (docs/prompt.md, "Provider blocks")."""

from __future__ import annotations

import json
from typing import Any

from psych.sidecar.v1 import content_pb2, run_pb2
from tests.support.prompts import provider_block
from tests.support.requests import text_part

ANTHROPIC_KEPT = {"thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result"}


def block_bytes(block: dict[str, Any]) -> bytes:
    """The block as the host keeps it: its JSON as it read it."""
    return json.dumps(block, ensure_ascii=False).encode()


def _message(
    content: list[content_pb2.ContentPart], calls: list[content_pb2.ToolCall]
) -> run_pb2.Record:
    return run_pb2.Record(
        assistant_message=run_pb2.AssistantMessage(content=content, tool_calls=calls)
    )


def anthropic_record(response: dict[str, Any]) -> tuple[run_pb2.Record, list[bytes]]:
    """A Messages API response: thinking and server-tool blocks kept, text as text, tool_use
    as tool calls. Returns the record and the blocks kept, in order."""
    content, calls, kept = [], [], []
    for block in response["content"]:
        if block["type"] in ANTHROPIC_KEPT:
            data = block_bytes(block)
            content.append(provider_block(content_pb2.PROVIDER_ANTHROPIC, data, block["type"]))
            kept.append(data)
        elif block["type"] == "text":
            content.append(text_part(block["text"]))
        elif block["type"] == "tool_use":
            arguments = json.dumps(block["input"])
            calls.append(
                content_pb2.ToolCall(
                    call_id=block["id"], name=block["name"], arguments_json=arguments
                )
            )
    return _message(content, calls), kept


def openai_record(response: dict[str, Any]) -> tuple[run_pb2.Record, list[bytes]]:
    """A Responses API response: every output item kept (OpenAI checks a reasoning item and
    the items after it together), message text also as text, function calls also as calls."""
    content: list[content_pb2.ContentPart] = []
    calls: list[content_pb2.ToolCall] = []
    kept: list[bytes] = []
    for item in response["output"]:
        data = block_bytes(item)
        call_id = item["call_id"] if item["type"] == "function_call" else ""
        if item["type"] == "message":
            content.extend(text_part(c["text"]) for c in item["content"] if c.get("text"))
        if item["type"] == "function_call":
            calls.append(
                content_pb2.ToolCall(
                    call_id=call_id, name=item["name"], arguments_json=item["arguments"]
                )
            )
        content.append(provider_block(content_pb2.PROVIDER_OPENAI, data, item["type"], call_id))
        kept.append(data)
    return _message(content, calls), kept


def gemini_record(
    response: dict[str, Any], call_ids: list[str]
) -> tuple[run_pb2.Record, list[bytes]]:
    """A generateContent response: thought parts and parts with a thoughtSignature kept (a
    signed functionCall with its call's id, a signed text part as type text); text as text,
    function calls as calls with the ids the host gives them (`call_ids`, in order)."""
    content, calls, kept = [], [], []
    ids = iter(call_ids)
    for part in response["candidates"][0]["content"]["parts"]:
        signed = "thoughtSignature" in part or part.get("thought")
        call_id = ""
        if "functionCall" in part:
            call = part["functionCall"]
            call_id = next(ids)
            calls.append(
                content_pb2.ToolCall(
                    call_id=call_id, name=call["name"], arguments_json=json.dumps(call["args"])
                )
            )
        elif "text" in part and not part.get("thought"):
            content.append(text_part(part["text"]))
        if signed:
            data = block_bytes(part)
            kind = "thought" if part.get("thought") else "functionCall" if call_id else "text"
            content.append(provider_block(content_pb2.PROVIDER_GEMINI, data, kind, call_id))
            kept.append(data)
    return _message(content, calls), kept

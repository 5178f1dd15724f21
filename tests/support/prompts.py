"""Builders and checks for the prompt, tool-output and dispatch tests."""

from __future__ import annotations

import itertools
import json
from typing import Any

from anthropic.types.beta.message_create_params import (
    MessageCreateParamsNonStreaming as BetaMessageCreateParamsNonStreaming,
)
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from google.genai import types as gemini_types
from google.protobuf import timestamp_pb2
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import TypeAdapter

from psych.sidecar.v1 import (
    content_pb2,
    run_pb2,
    run_service_pb2,
    spec_pb2,
    tool_service_pb2,
    turn_service_pb2,
)
from tests.support.requests import publish, text_part
from tests.support.sidecar import Stubs

ANTHROPIC_REQUEST = TypeAdapter(MessageCreateParamsNonStreaming)
# The beta Messages API's request: context_management edits and compaction blocks.
ANTHROPIC_BETA_REQUEST = TypeAdapter(BetaMessageCreateParamsNonStreaming)
OPENAI_REQUEST = TypeAdapter(CompletionCreateParamsNonStreaming)
OPENAI_RESPONSES_REQUEST = TypeAdapter(ResponseCreateParamsNonStreaming)
NOON = timestamp_pb2.Timestamp(seconds=1_796_126_400)  # Tuesday, 2026-12-01T12:00:00Z


def assistant(text: str = "", *calls: tuple[str, str, str]) -> run_pb2.Record:
    """An assistant message with text and (call_id, name, arguments_json) tool calls."""
    return run_pb2.Record(
        assistant_message=run_pb2.AssistantMessage(
            content=[text_part(text)] if text else [],
            tool_calls=[
                content_pb2.ToolCall(call_id=c, name=n, arguments_json=a) for c, n, a in calls
            ],
        )
    )


def provider_block(
    provider: int, data: bytes, block_type: str, call_id: str = ""
) -> content_pb2.ContentPart:
    """A provider's own block, as a host appends it from a response."""
    return content_pb2.ContentPart(
        provider_block=content_pb2.ProviderBlock(
            provider=provider,  # type: ignore[arg-type]
            type=block_type,
            json=data,
            call_id=call_id,
        )
    )


def result(
    call_id: str, *parts: content_pb2.ContentPart | str, is_error: bool = False
) -> run_pb2.Record:
    content = [text_part(p) if isinstance(p, str) else p for p in parts]
    return run_pb2.Record(
        tool_result=run_pb2.ToolResult(
            call_id=call_id, tool="host_tool", is_error=is_error, content=content
        )
    )


def binary(mime_type: str, data: bytes) -> content_pb2.ContentPart:
    return content_pb2.ContentPart(binary=content_pb2.BinaryContent(mime_type=mime_type, data=data))


def run_with(stubs: Stubs, spec_name: str, tenant: str = "tenant-a", **spec: Any) -> str:
    """A Run of a freshly published Spec with the given fields."""
    publish(stubs, spec_name, **spec)
    request = run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec_name, spec_version=1)
    return stubs.runs.CreateRun(request).run.run_id


def thresholds(**values: int) -> spec_pb2.Thresholds:
    return spec_pb2.Thresholds(**values)


def append(
    stubs: Stubs, run_id: str, *records: run_pb2.Record
) -> list[run_service_pb2.AppendedRecord]:
    response = stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=list(records))
    )
    return list(response.records)


def assemble(stubs: Stubs, run_id: str, **fields: Any) -> turn_service_pb2.AssemblePromptResponse:
    fields.setdefault("now", NOON)
    fields.setdefault("model", "claude-test")
    return stubs.turns.AssemblePrompt(
        turn_service_pb2.AssemblePromptRequest(run_id=run_id, **fields)
    )


def read(
    stubs: Stubs, run_id: str, handle: str, **fields: Any
) -> tool_service_pb2.ReadToolOutputResponse:
    return stubs.tools.ReadToolOutput(
        tool_service_pb2.ReadToolOutputRequest(run_id=run_id, handle=handle, **fields)
    )


def dispatch(
    stubs: Stubs, run_id: str, call_id: str, name: str, arguments: Any
) -> tool_service_pb2.DispatchToolCallResponse:
    arguments_json = arguments if isinstance(arguments, str) else json.dumps(arguments)
    call = content_pb2.ToolCall(call_id=call_id, name=name, arguments_json=arguments_json)
    return stubs.tools.DispatchToolCall(
        tool_service_pb2.DispatchToolCallRequest(run_id=run_id, call=call)
    )


def history_results(response: turn_service_pb2.AssemblePromptResponse) -> dict[str, Any]:
    """The prompt's tool results by call id."""
    return {
        part.tool_result.call_id: part.tool_result
        for message in response.prompt.history
        for part in message.parts
        if part.WhichOneof("kind") == "tool_result"
    }


def _materialized(value: Any) -> Any:
    """Pydantic validates iterables lazily: walking them is what validates their items."""
    if isinstance(value, dict):
        return {key: _materialized(item) for key, item in value.items()}
    if value is None or isinstance(value, str | bytes | int | float | bool):
        return value
    return [_materialized(item) for item in value]


def valid_anthropic(body: bytes) -> dict[str, Any]:
    """The body, checked against the official SDK's request type: every key must be one the
    type knows (validation drops unknown keys, so the round trip must be lossless), and the
    rules the type cannot express: tool results first in their message and answering the
    previous assistant message's tool_use blocks, roles alternating, at most 4 cache
    breakpoints, and a final user message."""
    parsed: dict[str, Any] = json.loads(body)
    assert _materialized(ANTHROPIC_REQUEST.validate_python(parsed)) == parsed
    return _anthropic_rules(parsed)


def valid_anthropic_beta(body: bytes) -> dict[str, Any]:
    """As valid_anthropic, against the SDK's beta request type (the type of a request sent
    with an anthropic-beta header, which has context_management and compaction blocks).
    A tool's `input_schema` is any JSON Schema object there (`Union[InputSchemaTyped,
    Dict[str, object]]`), but the beta typed branch, unlike the non-beta one, is not
    configured to keep extra keys, so pydantic drops `additionalProperties` and the like
    from it: the schemas are compared as the dicts the union allows."""
    parsed: dict[str, Any] = json.loads(body)
    validated = _materialized(ANTHROPIC_BETA_REQUEST.validate_python(parsed))
    for tool, sent in zip(validated.get("tools", []), parsed.get("tools", []), strict=True):
        if "input_schema" in sent:
            assert isinstance(sent["input_schema"], dict)
            assert sent["input_schema"]["type"] == "object"
            tool["input_schema"] = sent["input_schema"]
    assert validated == parsed
    return _anthropic_rules(parsed)


def _anthropic_rules(parsed: dict[str, Any]) -> dict[str, Any]:
    breakpoints = [t for t in parsed.get("tools", []) if "cache_control" in t]
    breakpoints += [b for b in parsed.get("system", []) if "cache_control" in b]
    roles = [m["role"] for m in parsed["messages"]]
    assert roles[-1] == "user"
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    pending: set[str] = set()
    for message in parsed["messages"]:
        blocks = message["content"]
        assert blocks, "no empty messages"
        breakpoints += [b for b in blocks if "cache_control" in b]
        kinds = [b["type"] for b in blocks]
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        assert kinds[: len(results)] == ["tool_result"] * len(results), kinds
        assert sorted(results) == sorted(pending), (results, pending)
        pending = {b["id"] for b in blocks if b["type"] == "tool_use"}
        for block in blocks:
            if block["type"] == "text":
                assert block["text"], "no empty text blocks"
    assert not pending
    assert len(breakpoints) <= 4
    return parsed


def valid_openai(body: bytes) -> dict[str, Any]:
    """The body, checked against the official SDK's request type (losslessly, as above), and
    every assistant tool call answered by the role "tool" messages right after it."""
    parsed: dict[str, Any] = json.loads(body)
    assert _materialized(OPENAI_REQUEST.validate_python(parsed)) == parsed
    messages = parsed["messages"]
    assert messages[-1]["role"] == "user"
    for index, message in enumerate(messages):
        if message["role"] == "assistant" and message.get("tool_calls"):
            ids = [call["id"] for call in message["tool_calls"]]
            following = messages[index + 1 : index + 1 + len(ids)]
            assert [m["role"] for m in following] == ["tool"] * len(ids)
            assert sorted(m["tool_call_id"] for m in following) == sorted(ids)
        if message["role"] == "tool":
            previous = messages[index - 1]
            assert previous["role"] in ("assistant", "tool")
    return parsed


def anthropic_blocks(body: bytes) -> tuple[list[str], list[int]]:
    """A Messages request as Anthropic's cache sees it: its blocks in cache order (tools,
    system, then each message's content blocks; the role of a message's blocks and the model
    included), each as canonical JSON without its `cache_control`, and the 1-based positions
    of its breakpoints."""
    parsed = json.loads(body)
    raw: list[dict[str, Any]] = [dict(t, kind="tool") for t in parsed.get("tools", [])]
    raw += [dict(b, kind="system") for b in parsed.get("system", [])]
    for message in parsed["messages"]:
        raw += [dict(b, role=message["role"]) for b in message["content"]]
    blocks, breakpoints = [], []
    for position, block in enumerate(raw, 1):
        if block.pop("cache_control", None) is not None:
            breakpoints.append(position)
        blocks.append(json.dumps(block, sort_keys=True))
    return blocks, breakpoints


def cached_prefixes(body: bytes) -> set[tuple[str, ...]]:
    """The prefixes a call writes to the cache: one per breakpoint."""
    blocks, breakpoints = anthropic_blocks(body)
    return {tuple(blocks[:position]) for position in breakpoints}


def read_blocks(body: bytes, cache: set[tuple[str, ...]], lookback: int = 20) -> int:
    """How many leading blocks of this call Anthropic's cache serves, by its documented rule:
    at each breakpoint, the longest prefix ending there or up to `lookback` blocks before
    it that an earlier call wrote."""
    blocks, breakpoints = anthropic_blocks(body)
    best = 0
    for position in breakpoints:
        for end in range(position, max(position - lookback, 0) - 1, -1):
            if tuple(blocks[:end]) in cache:
                best = max(best, end)
                break
    return best


def valid_openai_responses(body: bytes) -> dict[str, Any]:
    """The Responses body, checked against the official SDK's request type (losslessly, as
    above), every function_call answered by the function_call_output items after it (before
    the next user message or function_call), and a final user message."""
    parsed: dict[str, Any] = json.loads(body)
    assert _materialized(OPENAI_RESPONSES_REQUEST.validate_python(parsed)) == parsed
    items = parsed["input"]
    assert items[-1]["type"] == "message"
    assert items[-1]["role"] == "user"
    pending: set[str] = set()
    answered: set[str] = set()
    for item in items:
        if item["type"] == "function_call":
            if answered:
                assert not pending, pending
                answered = set()
            pending.add(item["call_id"])
        elif item["type"] == "function_call_output":
            assert item["call_id"] in pending, item["call_id"]
            pending.remove(item["call_id"])
            answered.add(item["call_id"])
        elif item["type"] == "message":
            if item["role"] == "user":
                assert not pending, pending
            answered = set()
    assert not pending
    return parsed


def _gemini_lossless(model: Any, value: Any) -> None:
    """`value` read by the google-genai type (which forbids unknown keys) and written back
    the same: nothing in it the type does not know."""
    parsed = model.model_validate_json(json.dumps(value))
    assert parsed.model_dump(mode="json", by_alias=True, exclude_none=True) == value


def valid_gemini(body: bytes) -> dict[str, Any]:
    """The Gemini generateContent body, each piece checked against the google-genai SDK's
    types losslessly, and the rules they cannot express: user and model contents
    alternating, starting and ending with user, and each model content's functionCall parts
    answered, in order and by name, by the functionResponse parts of the next content."""
    parsed: dict[str, Any] = json.loads(body)
    assert set(parsed) <= {"generationConfig", "tools", "systemInstruction", "contents"}
    _gemini_lossless(gemini_types.GenerationConfig, parsed["generationConfig"])
    for tool in parsed.get("tools", []):
        _gemini_lossless(gemini_types.Tool, tool)
    if "systemInstruction" in parsed:
        _gemini_lossless(gemini_types.Content, parsed["systemInstruction"])
    contents = parsed["contents"]
    roles = [c["role"] for c in contents]
    assert roles[0] == "user"
    assert roles[-1] == "user"
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    pending: list[str] = []
    for content in contents:
        _gemini_lossless(gemini_types.Content, content)
        parts = content["parts"]
        assert parts, "no empty contents"
        answered = [p["functionResponse"]["name"] for p in parts if "functionResponse" in p]
        assert answered == pending, (answered, pending)
        pending = [p["functionCall"]["name"] for p in parts if "functionCall" in p]
    assert not pending
    return parsed

"""Replay of recorded responses over the real server, on both databases: responses of a
thinking model in each provider's documented response shape (checked with the official SDKs'
response types), appended as a host does (tests/support/replay.py), come back in that
provider's next request body with no block lost, none reordered, not one byte changed."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from anthropic.types import Message
from google.genai import types as gemini_types
from openai.types.responses import Response

from tests.support.prompts import (
    append,
    assemble,
    result,
    run_with,
    valid_anthropic,
    valid_gemini,
    valid_openai,
    valid_openai_responses,
)
from tests.support.replay import anthropic_record, gemini_record, openai_record
from tests.support.requests import user
from tests.support.sidecar import Stubs

USAGE = {"input_tokens": 900, "output_tokens": 120}
ANTHROPIC: list[dict[str, Any]] = [
    {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {
                "type": "thinking",
                "thinking": "The user wants Paris and Köln; two lookups.",
                "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds0kJGP0Rhn0",
            },
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5"},
            {"type": "text", "text": "Looking both up."},
            {"type": "tool_use", "id": "toolu_01", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_02", "name": "weather", "input": {"city": "Köln"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": USAGE,
    },
    {
        "id": "msg_02",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "thinking", "thinking": "Rain in Köln; check tomorrow.", "signature": "Ev4B"},
            {"type": "tool_use", "id": "toolu_03", "name": "forecast", "input": {"days": 1}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": USAGE,
    },
]
OPENAI: list[dict[str, Any]] = [
    {
        "id": "resp_01",
        "object": "response",
        "created_at": 1796126400,
        "model": "gpt-5",
        "status": "completed",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "output": [
            {
                "type": "reasoning",
                "id": "rs_01",
                "summary": [{"type": "summary_text", "text": "Two lookups."}],
                "encrypted_content": "gAAAAABo-enc-01",
            },
            {
                "type": "function_call",
                "id": "fc_01",
                "call_id": "call_01",
                "name": "weather",
                "arguments": '{"city":"Paris"}',
                "status": "completed",
            },
            {
                "type": "function_call",
                "id": "fc_02",
                "call_id": "call_02",
                "name": "weather",
                "arguments": '{"city":"Köln"}',
                "status": "completed",
            },
        ],
    },
    {
        "id": "resp_02",
        "object": "response",
        "created_at": 1796126410,
        "model": "gpt-5",
        "status": "completed",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "output": [
            {"type": "reasoning", "id": "rs_02", "summary": [], "encrypted_content": "gAAAA-02"},
            {
                "type": "message",
                "id": "msg_02",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "Now the forecast.", "annotations": []}
                ],
            },
            {
                "type": "function_call",
                "id": "fc_03",
                "call_id": "call_03",
                "name": "forecast",
                "arguments": '{"days":1}',
                "status": "completed",
            },
        ],
    },
]
GEMINI: list[dict[str, Any]] = [
    {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "Two lookups.", "thought": True},
                        {
                            "functionCall": {"name": "weather", "args": {"city": "Paris"}},
                            "thoughtSignature": "Q2lRQmp6MWZTeW1O",
                        },
                        {"functionCall": {"name": "weather", "args": {"city": "Köln"}}},
                    ],
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "modelVersion": "gemini-3-pro",
    },
    {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "Now the forecast.", "thoughtSignature": "RXY0QkNrWUlCeGdD"},
                        {
                            "functionCall": {"name": "forecast", "args": {"days": 1}},
                            "thoughtSignature": "Q2lVQmp6",
                        },
                    ],
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "modelVersion": "gemini-3-pro",
    },
]
CALLS = [["c1", "c2"], ["c3"]]


def _in_order(body: bytes, blocks: list[bytes]) -> None:
    position = 0
    for data in blocks:
        assert body.count(data) == 1, data
        found = body.index(data)
        assert found >= position, data
        position = found + len(data)


def _bodies(response: Any) -> dict[str, bytes]:
    bodies = {
        "anthropic": response.anthropic_request_json,
        "openai": response.openai_request_json,
        "openai_responses": response.openai_responses_request_json,
        "gemini": response.gemini_request_json,
    }
    valid_anthropic(bodies["anthropic"])
    valid_openai(bodies["openai"])
    valid_openai_responses(bodies["openai_responses"])
    valid_gemini(bodies["gemini"])
    return bodies


def test_the_recorded_responses_are_in_the_providers_documented_shapes() -> None:
    for response in ANTHROPIC:
        assert Message.model_validate(response).model_dump(exclude_none=True)["content"]
    for response in OPENAI:
        assert Response.model_validate(response).output
    for response in GEMINI:
        parsed = gemini_types.GenerateContentResponse.model_validate_json(json.dumps(response))
        assert parsed.candidates


def _replay(
    stubs: Stubs,
    run_id: str,
    records: list[tuple[Any, list[bytes]]],
    body: str,
) -> None:
    """Append each response and its results; after each, the body holds every kept block."""
    append(stubs, run_id, user("Weather in Paris and Köln, and tomorrow?"))
    kept: list[bytes] = []
    for (record, blocks), calls in zip(records, CALLS, strict=True):
        kept.extend(blocks)
        ids = [c.call_id for c in record.assistant_message.tool_calls]
        append(stubs, run_id, record, *(result(i, f"{i}: 18 C") for i in ids))
        bodies = _bodies(assemble(stubs, run_id))
        _in_order(bodies[body], kept)
        for name, other in bodies.items():
            if name != body:
                assert not any(data in other for data in kept), name
        assert len(ids) == len(calls)


def test_anthropic_responses_replay_byte_for_byte(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), instructions="Answer briefly.")
    _replay(stubs, run_id, [anthropic_record(r) for r in ANTHROPIC], "anthropic")


def test_openai_responses_replay_byte_for_byte(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"), instructions="Answer briefly.")
    _replay(stubs, run_id, [openai_record(r) for r in OPENAI], "openai_responses")
    body = json.loads(assemble(stubs, run_id).openai_responses_request_json)
    # The output items as they came, then the results; the message text sent once.
    assert [i["type"] for i in body["input"][1:]] == [
        "reasoning",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "reasoning",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]


def test_gemini_responses_replay_byte_for_byte(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"), instructions="Answer briefly.")
    records = [gemini_record(r, ids) for r, ids in zip(GEMINI, CALLS, strict=True)]
    _replay(stubs, run_id, records, "gemini")
    body = json.loads(assemble(stubs, run_id).gemini_request_json)
    model = [c["parts"] for c in body["contents"] if c["role"] == "model"]
    assert model == [c["candidates"][0]["content"]["parts"] for c in GEMINI]

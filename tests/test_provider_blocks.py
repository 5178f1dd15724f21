"""Provider blocks over the real server, on both databases: a reasoning model's own blocks
stored byte for byte, sent back verbatim in their provider's body (checked against the
official SDK's request types) and left out of the others, bounded, and never logged."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import grpc
import pytest

from psych.sidecar.v1 import content_pb2, run_pb2, run_service_pb2, spec_pb2
from psych_sidecar.domain.estimate import estimate_tokens
from psych_sidecar.domain.runlog import MAX_PROVIDER_BLOCK_BYTES
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
from tests.support.requests import text_part, user
from tests.support.sidecar import Stubs, rpc_failure

ANTHROPIC = content_pb2.PROVIDER_ANTHROPIC
OPENAI = content_pb2.PROVIDER_OPENAI
GEMINI = content_pb2.PROVIDER_GEMINI

# Spelled as a provider might send them: spaces, key order of its own, escapes kept.
THINKING_1 = (
    b'{"type": "thinking", "thinking": "The user wants the weather in Par\\u00eds; '
    b'I should call get_weather.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pk'
    b'iMOYds0kJGP0Rhn0RmtNMVy0dnQSEyplSrzmqPHg9xDbhE6Pg1q5HaNdMqHJnpvHOBs2ZAuFQvCKg"}'
)
REDACTED = b'{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw"}'
THINKING_2 = b'{"signature":"Ev4BCkYIBxgCKkD2","thinking":"Now the forecast.","type":"thinking"}'
REASONING = b'{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAAAABo"}'


def block(
    provider: int, data: bytes, block_type: str = "thinking", call_id: str = ""
) -> content_pb2.ContentPart:
    return content_pb2.ContentPart(
        provider_block=content_pb2.ProviderBlock(
            provider=provider,  # type: ignore[arg-type]
            type=block_type,
            json=data,
            call_id=call_id,
        )
    )


def reply(*parts: content_pb2.ContentPart, calls: tuple[str, ...] = ()) -> run_pb2.Record:
    return run_pb2.Record(
        assistant_message=run_pb2.AssistantMessage(
            content=list(parts),
            tool_calls=[
                content_pb2.ToolCall(
                    call_id=c, name="get_weather", arguments_json='{"city":"Paris"}'
                )
                for c in calls
            ],
        )
    )


def thinking_turn(stubs: Stubs, run_id: str) -> None:
    """A multi-step tool-use turn of a thinking model, with an OpenAI block in it too."""
    append(
        stubs,
        run_id,
        user("Weather in Paris?"),
        reply(
            block(ANTHROPIC, THINKING_1),
            block(ANTHROPIC, REDACTED, "redacted_thinking"),
            block(OPENAI, REASONING, "reasoning"),
            text_part("Checking."),
            calls=("toolu_1",),
        ),
        result("toolu_1", "18 C, clear"),
        reply(block(ANTHROPIC, THINKING_2), calls=("toolu_2",)),
        result("toolu_2", "Tomorrow: rain"),
    )


def test_anthropic_blocks_go_back_verbatim_in_place_and_nowhere_else(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), instructions="Be brief.")
    thinking_turn(stubs, run_id)
    response = assemble(stubs, run_id)
    body = response.anthropic_request_json
    anthropic = valid_anthropic(body)
    first, second = anthropic["messages"][1], anthropic["messages"][3]
    assert [b["type"] for b in first["content"]] == [
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
    ]
    assert [b["type"] for b in second["content"]] == ["thinking", "tool_use"]
    # Byte for byte, in order, each once; the other provider's block is left out.
    for data in (THINKING_1, REDACTED, THINKING_2):
        assert body.count(data) == 1
    assert body.index(THINKING_1) < body.index(REDACTED) < body.index(THINKING_2)
    assert b"rs_1" not in body
    assert all("cache_control" not in b for b in first["content"][:2] + second["content"][:1])

    openai = valid_openai(response.openai_request_json)
    assert b"signature" not in response.openai_request_json
    assert b"rs_1" not in response.openai_request_json
    assistants = [m for m in openai["messages"] if m["role"] == "assistant"]
    assert [m["content"] for m in assistants] == [[{"type": "text", "text": "Checking."}], None]

    # The estimator counts what is sent: the larger body, thinking included.
    largest = max(len(body), len(response.openai_request_json))
    assert response.context_guard.estimated_tokens == estimate_tokens(largest)


def test_openai_reasoning_items_go_back_verbatim_before_their_calls(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), instructions="Be brief.")
    thinking_turn(stubs, run_id)
    response = assemble(stubs, run_id, dynamic_tail="Memory: likes rain.")
    body = response.openai_responses_request_json
    parsed = valid_openai_responses(body)
    assert list(parsed) == [
        "model",
        "max_output_tokens",
        "prompt_cache_key",
        "tools",
        "instructions",
        "input",
    ]
    assert (
        parsed["prompt_cache_key"] == json.loads(response.openai_request_json)["prompt_cache_key"]
    )
    assert parsed["instructions"].startswith("# Instructions\n\nBe brief.")
    assert all(tool["strict"] is False for tool in parsed["tools"])
    kinds = [(i["type"], i.get("role", "")) for i in parsed["input"]]
    assert kinds == [
        ("message", "developer"),
        ("message", "user"),
        ("reasoning", ""),
        ("message", "assistant"),
        ("function_call", ""),
        ("function_call_output", ""),
        ("function_call", ""),
        ("function_call_output", ""),
        ("message", "user"),
    ]
    assert body.count(REASONING) == 1
    for data in (THINKING_1, REDACTED, THINKING_2):
        assert data not in body
    assert parsed["input"][-1]["content"][0]["text"].startswith("Current date and time:")


def test_an_openai_function_call_item_is_sent_as_it_came(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    item = (
        b'{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather",'
        b'"arguments":"{\\"city\\":\\"Paris\\"}","status":"completed"}'
    )
    append(
        stubs,
        run_id,
        user("Weather?"),
        reply(
            block(OPENAI, REASONING, "reasoning"),
            block(OPENAI, item, "function_call", call_id="call_1"),
            calls=("call_1",),
        ),
        result("call_1", "18 C"),
    )
    response = assemble(stubs, run_id)
    body = response.openai_responses_request_json
    parsed = valid_openai_responses(body)
    assert [i["type"] for i in parsed["input"]] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert REASONING + b"," + item in body
    # The other bodies render the call themselves.
    anthropic = valid_anthropic(response.anthropic_request_json)
    assert anthropic["messages"][1]["content"][0]["id"] == "call_1"


def test_kept_message_items_carry_the_text_in_the_responses_body(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    message = (
        b'{"type":"message","id":"msg_1","role":"assistant","status":"completed",'
        b'"content":[{"type":"output_text","text":"Checking.","annotations":[]}]}'
    )
    append(
        stubs,
        run_id,
        user("Weather?"),
        reply(
            block(OPENAI, REASONING, "reasoning"),
            text_part("Checking."),
            block(OPENAI, message, "message"),
        ),
    )
    response = assemble(stubs, run_id)
    body = response.openai_responses_request_json
    parsed = valid_openai_responses(body)
    assert [i["type"] for i in parsed["input"]] == ["message", "reasoning", "message", "message"]
    assert REASONING + b"," + message in body
    assert body.count(b"Checking.") == 1
    # The other bodies show the text part.
    assert b"Checking." in response.anthropic_request_json
    assert b"Checking." in response.openai_request_json


GEMINI_THOUGHT = b'{"text": "Plan: look it up.", "thought": true, "thoughtSignature": "Q2lRQmp6"}'
GEMINI_CALL = (
    b'{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, '
    b'"thoughtSignature": "RXY0QkNrWUlCeGdD"}'
)


def test_gemini_parts_go_back_verbatim_with_their_signatures(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), instructions="Be brief.")
    append(
        stubs,
        run_id,
        user("Weather in Paris and Rome?"),
        reply(
            block(ANTHROPIC, THINKING_1),
            block(GEMINI, GEMINI_THOUGHT, "thought"),
            block(GEMINI, GEMINI_CALL, "functionCall", call_id="g1"),
            calls=("g1", "g2"),
        ),
        result("g1", "18 C"),
        result("g2", "21 C"),
    )
    response = assemble(stubs, run_id, dynamic_tail="Memory.")
    body = response.gemini_request_json
    gemini = valid_gemini(body)
    assert list(gemini) == ["generationConfig", "tools", "systemInstruction", "contents"]
    assert [p["text"] for p in gemini["systemInstruction"]["parts"]][1] == "Memory."
    model = gemini["contents"][1]
    assert model["role"] == "model"
    # The thought and the signed call as they came; the parallel call after it unsigned.
    assert GEMINI_THOUGHT + b"," + GEMINI_CALL + b',{"functionCall":' in body
    assert model["parts"][2] == {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}
    assert THINKING_1 not in body
    assert [p["functionResponse"]["response"] for p in gemini["contents"][2]["parts"][:2]] == [
        {"output": "18 C"},
        {"output": "21 C"},
    ]
    # The other bodies leave Gemini's parts out.
    for other in (
        response.anthropic_request_json,
        response.openai_request_json,
        response.openai_responses_request_json,
    ):
        assert b"thoughtSignature" not in other


def test_signed_gemini_text_parts_carry_the_text_in_the_gemini_body(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    signed = b'{"text":"Sunny.","thoughtSignature":"Q2lRQmp6"}'
    append(
        stubs,
        run_id,
        user("Weather?"),
        reply(text_part("Sunny."), block(GEMINI, signed, "text")),
    )
    response = assemble(stubs, run_id)
    gemini = valid_gemini(response.gemini_request_json)
    assert gemini["contents"][1] == {
        "role": "model",
        "parts": [{"text": "Sunny.", "thoughtSignature": "Q2lRQmp6"}],
    }
    assert b"Sunny." in response.anthropic_request_json


def test_blocks_are_stored_and_listed_byte_for_byte(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    thinking_turn(stubs, run_id)
    listed = stubs.runs.ListRecords(run_service_pb2.ListRecordsRequest(run_id=run_id))
    parts = [p for r in listed.records for p in r.assistant_message.content]
    blocks = [p.provider_block for p in parts if p.WhichOneof("kind") == "provider_block"]
    assert [(b.provider, b.type, b.json) for b in blocks] == [
        (ANTHROPIC, "thinking", THINKING_1),
        (ANTHROPIC, "redacted_thinking", REDACTED),
        (OPENAI, "reasoning", REASONING),
        (ANTHROPIC, "thinking", THINKING_2),
    ]
    prompt_blocks = [
        part.content.provider_block.json
        for message in assemble(stubs, run_id).prompt.history
        for part in message.parts
        if part.WhichOneof("kind") == "content"
        and part.content.WhichOneof("kind") == "provider_block"
    ]
    assert prompt_blocks == [THINKING_1, REDACTED, REASONING, THINKING_2]


def test_a_block_that_spells_a_call_is_sent_instead_of_the_rendered_call(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    tool_use = b'{"type":"tool_use","id":"toolu_9","name":"get_weather","input":{"city":"Paris"}}'
    append(
        stubs,
        run_id,
        user("Weather?"),
        reply(
            block(ANTHROPIC, THINKING_2),
            block(ANTHROPIC, tool_use, "tool_use", call_id="toolu_9"),
            calls=("toolu_9",),
        ),
        result("toolu_9", "18 C"),
    )
    response = assemble(stubs, run_id)
    body = response.anthropic_request_json
    anthropic = valid_anthropic(body)
    assert [b["type"] for b in anthropic["messages"][1]["content"]] == ["thinking", "tool_use"]
    assert body.count(b'"toolu_9"') == 2  # the verbatim tool_use and the tool_result
    assert tool_use in body
    # Chat Completions renders the call itself.
    openai = valid_openai(response.openai_request_json)
    (assistant,) = [m for m in openai["messages"] if m["role"] == "assistant"]
    assert assistant["tool_calls"][0]["id"] == "toolu_9"


def test_bad_blocks_are_refused_with_the_field_named(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))

    def refused(record: run_pb2.Record) -> tuple[str, str]:
        failure = rpc_failure(lambda: append(stubs, run_id, record))
        assert failure.code is grpc.StatusCode.INVALID_ARGUMENT
        return failure.info.reason, failure.info.metadata["field"]

    path = "records[0].assistant_message.content[0]"
    oversize = b'{"type":"thinking","thinking":"' + b"x" * MAX_PROVIDER_BLOCK_BYTES + b'"}'
    assert refused(reply(block(ANTHROPIC, oversize))) == (
        "FIELD_INVALID",
        f"{path}.provider_block.json",
    )
    for data in (b"[1, 2]", b"not json", b'{"a": 1} trailing', b"\xff{}"):
        assert refused(reply(block(ANTHROPIC, data))) == (
            "FIELD_INVALID",
            f"{path}.provider_block.json",
        )
    assert refused(reply(block(content_pb2.PROVIDER_UNSPECIFIED, THINKING_2))) == (
        "FIELD_REQUIRED",
        f"{path}.provider_block.provider",
    )
    assert refused(reply(block(ANTHROPIC, THINKING_2, ""))) == (
        "FIELD_REQUIRED",
        f"{path}.provider_block.type",
    )
    assert refused(reply(block(ANTHROPIC, THINKING_2, call_id="nope"), calls=("c1",))) == (
        "FIELD_INVALID",
        f"{path}.provider_block.call_id",
    )
    twice = reply(
        block(ANTHROPIC, THINKING_2, call_id="c1"),
        block(ANTHROPIC, THINKING_2, call_id="c1"),
        calls=("c1",),
    )
    assert refused(twice) == (
        "FIELD_INVALID",
        "records[0].assistant_message.content[1].provider_block.call_id",
    )
    in_user = run_pb2.Record(
        user_message=run_pb2.UserMessage(content=[block(ANTHROPIC, THINKING_2)])
    )
    assert refused(in_user) == (
        "FIELD_INVALID",
        "records[0].user_message.content[0].provider_block",
    )
    # Nothing was stored.
    listed = stubs.runs.ListRecords(run_service_pb2.ListRecordsRequest(run_id=run_id))
    assert list(listed.records) == []


def test_blocks_never_reach_the_log(
    stubs: Stubs, unique: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    run_id = run_with(stubs, unique("agent"))
    thinking_turn(stubs, run_id)
    assemble(stubs, run_id)
    rpc_failure(lambda: append(stubs, run_id, reply(block(ANTHROPIC, b"[" + THINKING_1))))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for secret in ("EqQBCgIYAhIM", "EmwKAhgBEgy3", "gAAAAABo", "Par\\u00eds"):
        assert secret not in logged
    assert json.loads(THINKING_1)["type"] == "thinking"


def test_earlier_turns_blocks_are_left_out_once_they_outgrow_a_quarter_of_the_budget(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    """Blocks are never elided; a long session's thinking would fill the window on its own.
    Earlier turns' blocks go once they take over a quarter of the budget, decided per turn."""
    budget = spec_pb2.ContextBudget(context_window_tokens=20_000, output_reserve_tokens=4_000)
    run_id = run_with(stubs, unique("agent"), context_budget=budget)
    small = b'{"type":"thinking","thinking":"short","signature":"c2ln"}'
    large = b'{"type":"thinking","thinking":"' + b"x" * 20_000 + b'","signature":"c2ln"}'
    append(stubs, run_id, user("Turn 1."), reply(block(ANTHROPIC, small), calls=("c1",)))
    append(stubs, run_id, result("c1", "ok"), reply(block(ANTHROPIC, large), calls=("c2",)))
    append(stubs, run_id, result("c2", "ok"))
    # Within the turn every block goes back, however large.
    within = assemble(stubs, run_id).anthropic_request_json
    assert small in within
    assert large in within
    append(stubs, run_id, reply(text_part("Done.")), user("Turn 2."))
    # The next turn: the earlier turn's blocks, 5,000 tokens against a quarter of 16,000,
    # are left out, all of them; the request stays valid.
    after = assemble(stubs, run_id)
    body = valid_anthropic(after.anthropic_request_json)
    assert small not in after.anthropic_request_json
    assert large not in after.anthropic_request_json
    assert [b["type"] for b in body["messages"][1]["content"]] == ["tool_use"]
    append(stubs, run_id, reply(block(ANTHROPIC, small), calls=("c3",)), result("c3", "ok"))
    assert small in assemble(stubs, run_id).anthropic_request_json  # this turn's block


def test_earlier_turns_small_blocks_stay(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    append(stubs, run_id, user("Turn 1."), reply(block(ANTHROPIC, THINKING_2), calls=("c1",)))
    append(stubs, run_id, result("c1", "ok"), reply(text_part("Done.")), user("Turn 2."))
    assert THINKING_2 in assemble(stubs, run_id).anthropic_request_json


def test_earlier_turns_blocks_go_before_the_guard_gives_up(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    """Within their share of the budget, but the prompt fits only without them: they go
    rather than the call failing with CONTEXT_BUDGET_EXCEEDED."""
    budget = spec_pb2.ContextBudget(context_window_tokens=20_000, output_reserve_tokens=4_000)
    run_id = run_with(stubs, unique("agent"), context_budget=budget)
    thinking = b'{"type":"thinking","thinking":"' + b"x" * 15_000 + b'","signature":"c2ln"}'
    append(stubs, run_id, user("Turn 1."), reply(block(ANTHROPIC, thinking), calls=("c1",)))
    append(stubs, run_id, result("c1", "ok"), reply(text_part("Done.")))
    append(stubs, run_id, user("Turn 2: " + "y" * 48_000))
    response = assemble(stubs, run_id)
    valid_anthropic(response.anthropic_request_json)
    assert thinking not in response.anthropic_request_json
    assert response.context_guard.estimated_tokens <= 16_000

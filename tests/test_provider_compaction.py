"""The provider's own compaction over the real server on both databases: the opt-in in the
policy (checked at publish and at the call, overridden per call), the Anthropic compaction
edit and its beta, the OpenAI Responses compaction entry, the block or item the provider
returns kept byte-exact and the records it replaces dropped from that provider's body only,
once, with each call of the turn a prefix of the next; and the bodies, compaction fields and
blocks included, validated against the official SDKs' request types."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from psych.sidecar.v1 import content_pb2, run_pb2, spec_pb2, turn_service_pb2
from tests.support.prompts import (
    append,
    assemble,
    assistant,
    provider_block,
    result,
    run_with,
    valid_anthropic,
    valid_anthropic_beta,
    valid_gemini,
    valid_openai,
    valid_openai_responses,
)
from tests.support.requests import all_records, publish, text_part, user
from tests.support.sidecar import Stubs, rpc_failure

ANTHROPIC = content_pb2.PROVIDER_ANTHROPIC
OPENAI = content_pb2.PROVIDER_OPENAI
BY_PROVIDER = spec_pb2.COMPACTION_BY_PROVIDER
POLICY = spec_pb2.CompactionPolicy(trigger_tokens=60_000, compaction_by=BY_PROVIDER)
BETA = "compact-2026-01-12"
# One transport is enough: the bodies do not depend on the socket.
SIDECAR_TRANSPORTS = ["unix"]

# Spelled as a provider might send them: spaces, key order of its own, escapes kept.
ANTHROPIC_BLOCK = (
    b'{"type": "compaction",  "content": "The user asked about Par\\u00eds twice; the vault '
    b'code is 7431-ZEBRA.", "encrypted_content": "Eo0BCkYIBxgCKkD2"}'
)
OPENAI_ITEM = b'{"encrypted_content":"gAAAAABpCompacted==","type":"compaction","id":"cmp_1"}'
OLD = "The early question about the weather in Lyon"


def early_turns(stubs: Stubs, run_id: str) -> None:
    """Two finished turns, each a tool-use step and an answer."""
    for index in (1, 2):
        append(stubs, run_id, user(f"{OLD}, number {index}."))
        append(stubs, run_id, assistant("", (f"e{index}", "lookup", '{"q": 1}')))
        append(stubs, run_id, result(f"e{index}", f"early result {index}"))
        append(stubs, run_id, assistant(f"Early answer {index}."))


def compacted_reply(block: content_pb2.ContentPart, call_id: str) -> run_pb2.Record:
    """The assistant message of a response that compacted: the provider's block first (as
    the host appends it), then the text and a tool call the model went on to write."""
    return run_pb2.Record(
        assistant_message=run_pb2.AssistantMessage(
            content=[block, text_part("Continuing from the summary.")],
            tool_calls=[content_pb2.ToolCall(call_id=call_id, name="lookup", arguments_json="{}")],
        )
    )


def _cached_blocks(body: bytes) -> list[str]:
    """An Anthropic request as its cache reads it, cache_control left out."""
    parsed = json.loads(body)
    blocks: list[Any] = [["tool", t] for t in parsed.get("tools", [])]
    blocks += [["system", b] for b in parsed.get("system", [])]
    for message in parsed["messages"]:
        blocks += [[message["role"], b] for b in message["content"]]
    return [
        json.dumps([role, {k: v for k, v in b.items() if k != "cache_control"}], sort_keys=True)
        for role, b in blocks
    ]


def _responses_items(body: bytes) -> list[str]:
    return [json.dumps(item, sort_keys=True) for item in json.loads(body)["input"]]


# The opt-in


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (
            spec_pb2.CompactionPolicy(trigger_tokens=10_000, compaction_by=BY_PROVIDER),
            "spec.compaction.trigger_tokens",
        ),
        (
            spec_pb2.CompactionPolicy(
                trigger_tokens=60_000, compaction_by=spec_pb2.COMPACTION_BY_UNSPECIFIED
            ),
            "spec.compaction.compaction_by",
        ),
    ],
)
def test_a_bad_provider_policy_is_refused_at_publish(
    stubs: Stubs, unique: Callable[[str], str], policy: spec_pb2.CompactionPolicy, field: str
) -> None:
    failure = rpc_failure(lambda: publish(stubs, unique("agent"), compaction=policy))
    assert failure.code is grpc.StatusCode.INVALID_ARGUMENT
    assert failure.info.reason == "FIELD_INVALID"
    assert failure.info.metadata["field"] == field


def test_the_opt_in_puts_the_providers_compaction_in_its_two_bodies_only(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    spec = publish(stubs, unique("agent"), compaction=POLICY)
    assert spec.compaction == POLICY
    run_id = run_with(stubs, unique("agent"), compaction=POLICY)
    early_turns(stubs, run_id)
    append(stubs, run_id, user("And now?"))
    response = assemble(stubs, run_id)
    assert list(response.anthropic_betas) == [BETA]
    anthropic = valid_anthropic_beta(response.anthropic_request_json)
    assert anthropic["context_management"] == {
        "edits": [
            {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 60_000}}
        ]
    }
    assert list(anthropic)[:3] == ["model", "max_tokens", "context_management"]
    responses = valid_openai_responses(response.openai_responses_request_json)
    assert responses["context_management"] == [{"type": "compaction", "compact_threshold": 60_000}]
    # Chat Completions and Gemini have no compaction of their own: their bodies are unchanged.
    for body in (response.openai_request_json, response.gemini_request_json):
        assert b"context_management" not in body
    valid_openai(response.openai_request_json)
    valid_gemini(response.gemini_request_json)

    host = run_with(
        stubs, unique("agent"), compaction=spec_pb2.CompactionPolicy(trigger_tokens=60_000)
    )
    append(stubs, host, user("hi"))
    plain = assemble(stubs, host)
    assert not plain.anthropic_betas
    valid_anthropic(plain.anthropic_request_json)
    assert b"context_management" not in plain.openai_responses_request_json
    # A compaction block sent back needs the beta too, edit or not.
    block = provider_block(ANTHROPIC, ANTHROPIC_BLOCK, "compaction")
    append(stubs, host, compacted_reply(block, "h1"), result("h1", "done"))
    sent_back = assemble(stubs, host)
    assert list(sent_back.anthropic_betas) == [BETA]
    assert b"context_management" not in sent_back.anthropic_request_json
    assert valid_anthropic_beta(sent_back.anthropic_request_json)["messages"][0]["content"][0] == (
        json.loads(ANTHROPIC_BLOCK)
    )


def test_the_opt_in_is_overridden_and_checked_at_the_call(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    host_policy = spec_pb2.CompactionPolicy(trigger_tokens=80_000)
    run_id = run_with(stubs, unique("agent"), compaction=host_policy)
    append(stubs, run_id, user("hi"))
    override = spec_pb2.CompactionPolicy(compaction_by=BY_PROVIDER)
    response = assemble(stubs, run_id, compaction=override)
    edit = json.loads(response.anthropic_request_json)["context_management"]["edits"][0]
    assert edit["trigger"]["value"] == 80_000
    instructions = spec_pb2.CompactionPolicy(
        compaction_by=BY_PROVIDER, summary_instructions="Keep every identifier."
    )
    response = assemble(stubs, run_id, compaction=instructions)
    edit = valid_anthropic_beta(response.anthropic_request_json)["context_management"]["edits"][0]
    assert edit["instructions"] == "Keep every identifier."

    low = spec_pb2.CompactionPolicy(trigger_tokens=1_000, compaction_by=BY_PROVIDER)
    failure = rpc_failure(lambda: assemble(stubs, run_id, compaction=low))
    assert failure.info.reason == "FIELD_INVALID"
    assert failure.info.metadata["field"] == "compaction.trigger_tokens"
    unspecified = spec_pb2.CompactionPolicy(compaction_by=spec_pb2.COMPACTION_BY_UNSPECIFIED)
    failure = rpc_failure(lambda: assemble(stubs, run_id, compaction=unspecified))
    assert failure.info.metadata["field"] == "compaction.compaction_by"

    # A fraction is judged against the call's budget.
    fraction = spec_pb2.CompactionPolicy(trigger_fraction=0.75, compaction_by=BY_PROVIDER)
    small = run_with(stubs, unique("agent"), compaction=fraction)
    append(stubs, small, user("hi"))
    budget = spec_pb2.ContextBudget(context_window_tokens=40_000)
    failure = rpc_failure(lambda: assemble(stubs, small, context_budget=budget))
    assert failure.info.metadata["field"] == "compaction.trigger_fraction"


# The block the provider returns


def test_an_anthropic_compaction_block_replaces_what_came_before_it_in_the_anthropic_body(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), compaction=POLICY)
    early_turns(stubs, run_id)
    append(stubs, run_id, user("Now the vault, please."))
    before = assemble(stubs, run_id)
    assert OLD.encode() in before.anthropic_request_json
    # The response compacted: the host appends its compaction block as a provider block.
    append(
        stubs,
        run_id,
        compacted_reply(provider_block(ANTHROPIC, ANTHROPIC_BLOCK, "compaction"), "v1"),
    )
    append(stubs, run_id, result("v1", "vault opened"))
    first = assemble(stubs, run_id)
    body = first.anthropic_request_json
    assert list(first.anthropic_betas) == [BETA]
    anthropic = valid_anthropic_beta(body)
    # The history starts at the block, byte-exact; nothing before it is sent.
    assert body.count(ANTHROPIC_BLOCK) == 1
    assert anthropic["messages"][0]["role"] == "assistant"
    assert anthropic["messages"][0]["content"][0] == json.loads(ANTHROPIC_BLOCK)
    assert OLD.encode() not in body
    assert b"Now the vault, please." not in body
    assert len(body) < len(before.anthropic_request_json)
    # Every other body keeps the whole history, and no Anthropic block.
    for other in (
        first.openai_request_json,
        first.openai_responses_request_json,
        first.gemini_request_json,
    ):
        assert OLD.encode() in other
        assert b"Eo0BCkYIBxgCKkD2" not in other
    valid_openai(first.openai_request_json)
    valid_openai_responses(first.openai_responses_request_json)
    valid_gemini(first.gemini_request_json)
    # The log keeps everything.
    assert [r.WhichOneof("kind") for r in all_records(stubs, run_id)].count("user_message") == 3

    # Within the turn, each call's body is a prefix of the next but for its transient block.
    append(stubs, run_id, assistant("", ("v2", "lookup", "{}")))
    append(stubs, run_id, result("v2", "second step"))
    second = assemble(stubs, run_id)
    earlier, later = _cached_blocks(body), _cached_blocks(second.anthropic_request_json)
    assert later[: len(earlier) - 1] == earlier[:-1]
    valid_anthropic_beta(second.anthropic_request_json)


def test_an_openai_compaction_item_replaces_the_items_before_it_in_the_responses_body(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), compaction=POLICY)
    early_turns(stubs, run_id)
    append(stubs, run_id, user("Now the vault, please."))
    before = assemble(stubs, run_id, dynamic_tail="Memories: none.", model="gpt-5.6")
    append(stubs, run_id, compacted_reply(provider_block(OPENAI, OPENAI_ITEM, "compaction"), "v1"))
    append(stubs, run_id, result("v1", "vault opened"))
    first = assemble(stubs, run_id, dynamic_tail="Memories: none.", model="gpt-5.6")
    body = first.openai_responses_request_json
    responses = valid_openai_responses(body)
    assert body.count(OPENAI_ITEM) == 1
    # Zone 2 stays (it is no conversation item); the history starts at the compaction item.
    assert [i.get("role", i["type"]) for i in responses["input"][:2]] == ["developer", "compaction"]
    assert OLD.encode() not in body
    assert len(body) < len(before.openai_responses_request_json)
    assert OLD.encode() in first.anthropic_request_json
    assert OPENAI_ITEM not in first.anthropic_request_json
    assert list(first.anthropic_betas) == [BETA]
    valid_anthropic_beta(first.anthropic_request_json)

    append(stubs, run_id, assistant("", ("v2", "lookup", "{}")))
    append(stubs, run_id, result("v2", "second step"))
    second = assemble(stubs, run_id, dynamic_tail="Memories: none.", model="gpt-5.6")
    earlier, later = _responses_items(body), _responses_items(second.openai_responses_request_json)
    assert later[: len(earlier) - 1] == earlier[:-1]
    valid_openai_responses(second.openai_responses_request_json)


def test_no_proposal_for_a_host_that_asks_only_for_the_bodies_the_provider_compacts(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), compaction=POLICY)
    for index in range(1, 9):
        append(stubs, run_id, user(f"Question {index}. " + "u" * 20_000))
        append(stubs, run_id, assistant(f"Answer {index}. " + "a" * 20_000))
    append(stubs, run_id, user("And now?"))
    provider_bodies = [
        turn_service_pb2.BODY_FORMAT_ANTHROPIC_MESSAGES,
        turn_service_pb2.BODY_FORMAT_OPENAI_RESPONSES,
    ]
    own = assemble(stubs, run_id, bodies=provider_bodies)
    assert own.context_guard.estimated_tokens > 60_000
    assert not own.HasField("compaction")
    chat = assemble(stubs, run_id, bodies=[turn_service_pb2.BODY_FORMAT_OPENAI_CHAT_COMPLETIONS])
    assert chat.HasField("compaction")


def test_a_compaction_block_stays_when_earlier_turns_blocks_are_left_out(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    """Earlier turns' provider blocks go once they outgrow a quarter of the budget; the
    compaction block does not, since its provider's history starts there."""
    policy = spec_pb2.CompactionPolicy(trigger_tokens=50_000, compaction_by=BY_PROVIDER)
    run_id = run_with(stubs, unique("agent"), compaction=policy)
    thinking = json.dumps({"type": "thinking", "thinking": "t" * 60_000, "signature": "c2ln"})
    append(stubs, run_id, user(f"{OLD}."))
    append(
        stubs,
        run_id,
        run_pb2.Record(
            assistant_message=run_pb2.AssistantMessage(
                content=[
                    provider_block(ANTHROPIC, thinking.encode(), "thinking"),
                    text_part("First answer."),
                ]
            )
        ),
    )
    append(stubs, run_id, user("Now the vault, please."))
    block = provider_block(ANTHROPIC, ANTHROPIC_BLOCK, "compaction")
    append(stubs, run_id, compacted_reply(block, "v1"), result("v1", "vault opened"))
    append(stubs, run_id, assistant("Opened."))
    append(stubs, run_id, user("Thanks. What next?"))
    budget = spec_pb2.ContextBudget(context_window_tokens=60_000)
    response = assemble(stubs, run_id, context_budget=budget)
    body = response.anthropic_request_json
    assert b"t" * 60_000 not in body
    assert body.count(ANTHROPIC_BLOCK) == 1
    anthropic = valid_anthropic_beta(body)
    assert anthropic["messages"][0]["content"][0] == json.loads(ANTHROPIC_BLOCK)
    assert OLD.encode() not in body


def test_a_required_compaction_tells_the_summary_bodys_beta(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    """A prompt that cannot fit is still to be compacted by the host, even for an Anthropic
    host under the provider's compaction: the response carries only the proposal, and the
    beta its Anthropic summary body needs."""
    policy = spec_pb2.CompactionPolicy(trigger_tokens=50_000, compaction_by=BY_PROVIDER)
    run_id = run_with(stubs, unique("agent"), compaction=policy)
    for index in range(1, 13):
        append(stubs, run_id, user(f"Question {index}. " + "u" * 10_000))
        append(stubs, run_id, assistant(f"Answer {index}. " + "a" * 10_000))
    append(stubs, run_id, user("And now?"))
    response = assemble(
        stubs,
        run_id,
        bodies=[turn_service_pb2.BODY_FORMAT_ANTHROPIC_MESSAGES],
        context_budget=spec_pb2.ContextBudget(context_window_tokens=60_000),
    )
    assert response.compaction.required
    assert not response.anthropic_request_json
    assert list(response.anthropic_betas) == [BETA]
    summary = valid_anthropic_beta(response.compaction.anthropic_request_json)
    assert summary["context_management"]["edits"][0]["type"] == "compact_20260112"

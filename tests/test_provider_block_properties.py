"""Property tests (hypothesis) of provider blocks over the real server, on both databases:
within a turn each call's body, for every provider, is a byte prefix of the next but for its
trailing transient block, and a block appended at one step goes back unchanged, in order,
at every later step (every provider's rule keeps them all, docs/prompt.md)."""

from __future__ import annotations

import itertools
import json
import uuid

from google.protobuf import timestamp_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psych.sidecar.v1 import content_pb2, run_pb2, turn_service_pb2
from psych_sidecar.domain.canonical import canonical_json
from tests.support.prompts import (
    append,
    assemble,
    provider_block,
    result,
    run_with,
    thresholds,
    valid_anthropic,
    valid_gemini,
    valid_openai,
    valid_openai_responses,
)
from tests.support.requests import text_part, user
from tests.support.sidecar import Stubs

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROVIDERS = ("anthropic", "openai", "gemini")

# A step: the sizes of its results, and whether the model wrote text besides thinking.
STEP = st.tuples(st.lists(st.sampled_from([20, 300, 5000]), min_size=1, max_size=3), st.booleans())
TURNS = st.lists(st.lists(STEP, min_size=1, max_size=4), min_size=1, max_size=3)
THOUGHT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60)


def _blocks(step: str, thought: str) -> dict[str, bytes]:
    """One step's blocks as each provider sends them (spaces and escapes of their own)."""
    text = json.dumps(thought)  # non-ASCII as escapes, kept as they are
    return {
        "anthropic": (
            f'{{"type": "thinking", "thinking": {text}, "signature": "sig{step}"}}'.encode()
        ),
        "openai": f'{{"type":"reasoning","id":"rs_{step}","summary":[],'
        f'"encrypted_content":"enc{step}"}}'.encode(),
        "gemini": f'{{"functionCall": {{"name": "tool", "args": {{}}}}, '
        f'"thoughtSignature": "c2ln{step:0>4}"}}'.encode(),
    }


def _trailing(body: bytes, provider: str) -> bytes:
    """The body less its trailing transient block: what the next call's body starts with."""
    parsed = json.loads(body)
    if provider == "openai":
        tail = b"," + canonical_json(parsed["messages"][-1]) + b"]}"
    elif provider == "openai_responses":
        tail = b"," + canonical_json(parsed["input"][-1]) + b"]}"
    else:
        tail = b"," + canonical_json(parsed["contents"][-1]["parts"][-1]) + b"]}]}"
    assert body.endswith(tail)
    return body[: -len(tail)]


def _anthropic_blocks(body: bytes) -> list[bytes]:
    parsed = json.loads(body)
    blocks = []
    for message in parsed["messages"]:
        for block in message["content"]:
            stripped = {k: v for k, v in block.items() if k != "cache_control"}
            blocks.append(json.dumps([message["role"], stripped]).encode())
    return blocks


def _bodies(response: turn_service_pb2.AssemblePromptResponse) -> dict[str, bytes]:
    return {
        "anthropic": response.anthropic_request_json,
        "openai": response.openai_request_json,
        "openai_responses": response.openai_responses_request_json,
        "gemini": response.gemini_request_json,
    }


def _in_order(body: bytes, blocks: list[bytes]) -> bool:
    position = 0
    for data in blocks:
        if body.count(data) != 1:
            return False
        found = body.index(data)
        if found < position:
            return False
        position = found + len(data)
    return True


@SETTINGS
@given(turns=TURNS, thought=THOUGHT)
def test_each_call_is_a_byte_prefix_of_the_next_and_blocks_never_change(
    stubs: Stubs, turns: list[list[tuple[list[int], bool]]], thought: str
) -> None:
    run_id = run_with(
        stubs,
        f"agent-{uuid.uuid4().hex[:8]}",
        instructions="Be helpful.",
        thresholds=thresholds(per_result_tokens=200, per_batch_tokens=400),
    )
    steps = itertools.count()
    sent: dict[str, list[bytes]] = {p: [] for p in PROVIDERS}
    for turn_index, turn in enumerate(turns):
        append(stubs, run_id, user(f"turn {turn_index}"))
        previous = assemble(stubs, run_id, now=_tick(turn_index, 0))
        for step_index, (sizes, with_text) in enumerate(turn):
            step = str(next(steps))
            ids = [f"call{step}_{i}" for i in range(len(sizes))]
            blocks = _blocks(step, thought)
            content = [
                provider_block(content_pb2.PROVIDER_ANTHROPIC, blocks["anthropic"], "thinking"),
                provider_block(content_pb2.PROVIDER_OPENAI, blocks["openai"], "reasoning"),
            ]
            if with_text:
                content.append(text_part(f"step {step}"))
            content.append(
                provider_block(
                    content_pb2.PROVIDER_GEMINI, blocks["gemini"], "functionCall", ids[0]
                )
            )
            for provider in PROVIDERS:
                sent[provider].append(blocks[provider])
            message = run_pb2.AssistantMessage(
                content=content,
                tool_calls=[content_pb2.ToolCall(call_id=i, name="tool") for i in ids],
            )
            append(stubs, run_id, run_pb2.Record(assistant_message=message))
            append(
                stubs,
                run_id,
                *(result(i, "x" * size) for i, size in zip(ids, sizes, strict=True)),
            )
            current = assemble(stubs, run_id, now=_tick(turn_index, step_index + 1))
            before, after = _bodies(previous), _bodies(current)
            valid_anthropic(after["anthropic"])
            valid_openai(after["openai"])
            valid_openai_responses(after["openai_responses"])
            valid_gemini(after["gemini"])
            for name in ("openai", "openai_responses", "gemini"):
                assert after[name].startswith(_trailing(before[name], name)), name
            old, new = _anthropic_blocks(before["anthropic"]), _anthropic_blocks(after["anthropic"])
            assert new[: len(old) - 1] == old[:-1]
            # Every block so far, unchanged and in order, in its own provider's body only.
            assert _in_order(after["anthropic"], sent["anthropic"])
            assert _in_order(after["openai_responses"], sent["openai"])
            assert _in_order(after["gemini"], sent["gemini"])
            for data in (*sent["anthropic"], *sent["openai"], *sent["gemini"]):
                assert data not in after["openai"]
            previous = current


def _tick(turn: int, step: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=1_796_126_400 + 3600 * turn + 7 * step)

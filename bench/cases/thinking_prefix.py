"""Prefix stability with a reasoning model's blocks in the log, and the Responses body's size
against the Chat Completions body's."""

from __future__ import annotations

import base64
import json
import random
import statistics
from typing import Any

from google.protobuf import timestamp_pb2

from bench._proc import channel, sidecar
from bench.cases.prompt_budget import (
    NOON,
    _append,
    _cache_blocks,
    _log_text,
    _new_run,
    _prefix_share,
    _result,
    _user,
)
from bench.registry import BenchContext, case
from psych.sidecar.v1 import content_pb2, run_pb2, turn_service_pb2, turn_service_pb2_grpc
from psych_sidecar.domain.canonical import canonical_json


def _block(provider: int, data: bytes, block_type: str, call_id: str = "") -> Any:
    return content_pb2.ContentPart(
        provider_block=content_pb2.ProviderBlock(
            provider=provider,  # type: ignore[arg-type]
            type=block_type,
            json=data,
            call_id=call_id,
        )
    )


def _thinking_step(call_id: str, rng: random.Random) -> run_pb2.Record:
    """One model step of a thinking model, as each provider would have returned it: an
    Anthropic thinking block (0.3-2.4 KB of thinking, a signature), an OpenAI reasoning item
    (0.7-2.7 KB of encrypted content), a Gemini functionCall part with its thought signature.
    Larger blocks at every one of the 160 steps outgrow the default 200,000-token window:
    provider blocks are never elided (docs/prompt.md)."""
    thinking = " ".join(f"step{rng.randint(0, 999)}" for _ in range(rng.randint(40, 300)))
    signature = base64.b64encode(rng.randbytes(rng.randint(200, 600))).decode()
    encrypted = base64.b64encode(rng.randbytes(rng.randint(500, 2000))).decode()
    anthropic = {"type": "thinking", "thinking": thinking, "signature": signature}
    openai = {
        "type": "reasoning",
        "id": f"rs_{call_id}",
        "summary": [],
        "encrypted_content": encrypted,
    }
    gemini = {
        "functionCall": {"name": "run_query", "args": {"q": 1}},
        "thoughtSignature": base64.b64encode(rng.randbytes(300)).decode(),
    }
    return run_pb2.Record(
        assistant_message=run_pb2.AssistantMessage(
            content=[
                _block(content_pb2.PROVIDER_ANTHROPIC, json.dumps(anthropic).encode(), "thinking"),
                _block(content_pb2.PROVIDER_OPENAI, json.dumps(openai).encode(), "reasoning"),
                _block(
                    content_pb2.PROVIDER_GEMINI,
                    json.dumps(gemini).encode(),
                    "functionCall",
                    call_id,
                ),
            ],
            tool_calls=[
                content_pb2.ToolCall(call_id=call_id, name="run_query", arguments_json='{"q": 1}')
            ],
        )
    )


def _without_trailing(body: bytes, key: str) -> bytes:
    """A body less its trailing transient item (Chat, Responses) or part (Gemini)."""
    parsed = json.loads(body)
    if key == "contents":
        tail = b"," + canonical_json(parsed["contents"][-1]["parts"][-1]) + b"]}]}"
    else:
        tail = b"," + canonical_json(parsed[key][-1]) + b"]}"
    return body[: -len(tail)] if body.endswith(tail) else body


def _byte_prefix_share(previous: bytes, current: bytes, key: str) -> float:
    """The previous body's bytes (less its trailing transient block) that the current body
    starts with, over the previous body's bytes."""
    kept = _without_trailing(previous, key)
    low, high = 0, min(len(kept), len(current))
    while low < high:  # the longest common prefix, by bisection
        middle = (low + high + 1) // 2
        if current[:middle] == kept[:middle]:
            low = middle
        else:
            high = middle - 1
    return low / len(previous)


BODIES = {
    "openai_chat": ("openai_request_json", "messages"),
    "openai_responses": ("openai_responses_request_json", "input"),
    "gemini": ("gemini_request_json", "contents"),
}


@case("prefix_stability_within_turn_thinking", unit="ratio", target=">= 0.995")
async def prefix_stability_within_turn_thinking(ctx: BenchContext) -> float:
    """prefix_stability_within_turn with a thinking model: every model step carries an
    Anthropic thinking block, an OpenAI reasoning item and a Gemini signed function call.

    The same scripted Run (20 turns of 8 steps, one result in four 256 KiB, the rest 200 B
    to 4 KiB; `--quick`: 6 turns, 64 KiB). The value is the Anthropic body's, blocks
    compared in its cache's order, cache_control left out, as prefix_stability_within_turn.
    Details: the same share, byte for byte on the whole body less its trailing transient
    block, for the Chat Completions, Responses and Gemini bodies; the thinking blocks' share
    of the last Anthropic body; and the Responses body's size against the Chat Completions
    body's (mean over calls, and at the last call).
    """
    turns_count = ctx.pick(full=20, quick=6)
    steps = 8
    huge = ctx.pick(full=256 * 1024, quick=64 * 1024)
    rng = random.Random(20261204)
    within: list[float] = []
    others: dict[str, list[float]] = {name: [] for name in BODIES}
    size_ratios: list[float] = []
    thinking_bytes = 0
    reasoning: list[bytes] = []
    last: Any = None
    async with sidecar(ctx.tmp_dir) as server, channel(server.target) as ch:
        run_id = await _new_run(ch, "thinking-prefix")
        turns = turn_service_pb2_grpc.TurnServiceStub(ch)
        previous: Any = None
        clock = NOON
        for turn in range(turns_count):
            await _append(ch, run_id, [_user(f"Turn {turn}: find the failing worker.")])
            for step in range(steps):
                clock += 20
                response = await turns.AssemblePrompt(
                    turn_service_pb2.AssemblePromptRequest(
                        run_id=run_id,
                        now=timestamp_pb2.Timestamp(seconds=clock),
                        dynamic_tail="User prefers short answers.",
                        model="m",
                    ),
                    timeout=120,
                )
                size_ratios.append(
                    len(response.openai_responses_request_json) / len(response.openai_request_json)
                )
                if previous is not None and step > 0:
                    within.append(
                        _prefix_share(
                            _cache_blocks(previous.anthropic_request_json),
                            _cache_blocks(response.anthropic_request_json),
                        )
                    )
                    for name, (field, key) in BODIES.items():
                        others[name].append(
                            _byte_prefix_share(
                                getattr(previous, field), getattr(response, field), key
                            )
                        )
                previous = last = response
                call_id = f"t{turn}s{step}"
                record = _thinking_step(call_id, rng)
                thinking_bytes += len(record.assistant_message.content[0].provider_block.json)
                reasoning.append(record.assistant_message.content[1].provider_block.json)
                size = huge if rng.random() < 0.25 else rng.randint(200, 4096)
                output = _log_text(size, turn * steps + step)
                await _append(ch, run_id, [record, _result(call_id, output)])
    value = statistics.fmean(within)
    # The reasoning items the last Responses body sends (earlier turns' may be left out).
    sent_reasoning = sum(len(r) for r in reasoning if r in last.openai_responses_request_json)
    ctx.details.update(
        {
            "turns": turns_count,
            "steps_per_turn": steps,
            "within_turn_calls": len(within),
            "min_within_turn": round(min(within), 4),
            **{f"{name}_within_turn": round(statistics.fmean(v), 4) for name, v in others.items()},
            **{f"{name}_min_within_turn": round(min(v), 4) for name, v in others.items()},
            "anthropic_thinking_bytes_appended": thinking_bytes,
            "reasoning_bytes_in_last_responses_body": sent_reasoning,
            "anthropic_last_body_bytes": len(last.anthropic_request_json),
            "responses_over_chat_bytes_mean": round(statistics.fmean(size_ratios), 4),
            "responses_over_chat_bytes_last": round(
                len(last.openai_responses_request_json) / len(last.openai_request_json), 4
            ),
            # The Responses body less the reasoning items it sends back (the Chat Completions
            # body has no place for them): the two formats' own overhead.
            "responses_less_reasoning_over_chat_bytes_last": round(
                (len(last.openai_responses_request_json) - sent_reasoning)
                / len(last.openai_request_json),
                4,
            ),
            "chat_last_body_bytes": len(last.openai_request_json),
            "responses_last_body_bytes": len(last.openai_responses_request_json),
            "gemini_last_body_bytes": len(last.gemini_request_json),
        }
    )
    return value

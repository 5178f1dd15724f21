"""The prompt budget: AssemblePrompt's cost against what is stored, the cached prefix across
the calls of a turn, and the token estimator's speed."""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import grpc.aio
from google.protobuf import timestamp_pb2

from bench._proc import channel, sidecar
from bench.registry import BenchContext, case
from psych.sidecar.v1 import (
    content_pb2,
    run_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    spec_service_pb2,
    spec_service_pb2_grpc,
    turn_service_pb2,
    turn_service_pb2_grpc,
)
from psych_sidecar.domain.estimate import estimate_text_tokens

MIB = 1024 * 1024
NOON = 1_796_126_400  # 2026-12-01T12:00:00Z


def _user(text: str) -> run_pb2.Record:
    return run_pb2.Record(
        user_message=run_pb2.UserMessage(content=[content_pb2.ContentPart(text=text)])
    )


def _assistant(text: str, call_ids: Sequence[str]) -> run_pb2.Record:
    return run_pb2.Record(
        assistant_message=run_pb2.AssistantMessage(
            content=[content_pb2.ContentPart(text=text)] if text else [],
            tool_calls=[
                content_pb2.ToolCall(call_id=c, name="run_query", arguments_json='{"q": 1}')
                for c in call_ids
            ],
        )
    )


def _result(call_id: str, text: str) -> run_pb2.Record:
    return run_pb2.Record(
        tool_result=run_pb2.ToolResult(
            call_id=call_id, tool="run_query", content=[content_pb2.ContentPart(text=text)]
        )
    )


def _log_text(size: int, seed: int) -> str:
    """`size` characters of tool output that looks like a log."""
    line = f"2026-12-01T12:00:00Z INFO worker={seed} request handled status=200 took=12ms\n"
    return (line * (size // len(line) + 1))[:size]


async def _new_run(ch: grpc.aio.Channel, name: str) -> str:
    specs = spec_service_pb2_grpc.SpecServiceStub(ch)
    spec = spec_pb2.Spec(
        name=name,
        version=1,
        instructions="You answer questions about the service's logs.",
        capability_notes=["You can run queries against the log store."],
    )
    await specs.PublishSpec(spec_service_pb2.PublishSpecRequest(spec=spec), timeout=60)
    runs = run_service_pb2_grpc.RunServiceStub(ch)
    created = await runs.CreateRun(
        run_service_pb2.CreateRunRequest(tenant="bench", spec_name=name, spec_version=1),
        timeout=60,
    )
    return created.run.run_id


async def _append(ch: grpc.aio.Channel, run_id: str, records: list[run_pb2.Record]) -> None:
    runs = run_service_pb2_grpc.RunServiceStub(ch)
    await runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=records), timeout=600
    )


async def _fill(ch: grpc.aio.Channel, run_id: str, result_chars: int) -> int:
    """2,000 records: 250 turns of user, assistant (2 calls), 2 results, assistant (2 calls),
    2 results, assistant text, with the last turn's text replaced by the new user message
    that makes every result a prior-turn result. Returns the bytes of tool output stored."""
    stored = 0
    batch: list[run_pb2.Record] = []
    batch_bytes = 0
    for turn in range(250):
        calls = [f"t{turn}c{i}" for i in range(4)]
        records = [_user(f"Question {turn}: what failed?"), _assistant("Looking.", calls[:2])]
        records += [
            _result(c, _log_text(result_chars, turn * 4 + i)) for i, c in enumerate(calls[:2])
        ]
        records.append(_assistant("", calls[2:]))
        records += [
            _result(c, _log_text(result_chars, turn * 4 + i)) for i, c in enumerate(calls[2:])
        ]
        records.append(_assistant(f"Answer {turn}.", []) if turn < 249 else _user("One more."))
        stored += 4 * result_chars
        for record in records:
            batch.append(record)
            batch_bytes += record.ByteSize()
            if batch_bytes >= 16 * MIB:
                await _append(ch, run_id, batch)
                batch, batch_bytes = [], 0
    await _append(ch, run_id, batch)
    return stored


# What a host that sends one body asks for (AssemblePromptRequest.bodies); empty: all four.
ONE_BODY = (turn_service_pb2.BODY_FORMAT_ANTHROPIC_MESSAGES,)


async def _assemble_seconds(
    turns: turn_service_pb2_grpc.TurnServiceAsyncStub,
    run_id: str,
    bodies: Sequence[turn_service_pb2.BodyFormat.ValueType] = (),
) -> tuple[float, int]:
    """One AssemblePrompt's time and its response's bytes."""
    request = turn_service_pb2.AssemblePromptRequest(
        run_id=run_id,
        now=timestamp_pb2.Timestamp(seconds=NOON),
        model="m",
        # The Run's elided history alone is ~320k estimated tokens: a window the context guard
        # never acts in, as this case measures assembly, not the guard.
        context_budget=spec_pb2.ContextBudget(context_window_tokens=1 << 40),
        bodies=bodies,
    )
    start = time.perf_counter()
    response = await turns.AssemblePrompt(request, timeout=600)
    seconds = time.perf_counter() - start
    if not response.anthropic_request_json:
        raise AssertionError("AssemblePrompt returned no request body")
    return seconds, response.ByteSize()


@case("assemble_scaling_ratio", unit="ratio", target="<= 1.5")
async def assemble_scaling_ratio(ctx: BenchContext) -> float:
    """AssemblePrompt time for a Run of 2,000 records holding 1 GiB of tool output divided by
    the same Run holding 1 MiB.

    Both Runs have 1,000 tool results in 250 turns and end with a new user message, so every
    result is a prior-turn result: the large Run's (1 MiB each) are elided to previews, the
    small Run's (1 KiB each) go in full. One sidecar on SQLite holds both. After a warm-up
    call each, rounds alternate the two Runs; the medians are compared. The first call of
    each (after the writes, OS cache warm) is reported as `cold_*`. --quick stores 64 MiB
    against 1 MiB.

    Each round also asks for the Anthropic body alone (`bodies`, as a host that sends one
    body does), interleaved with the calls for all four: `one_body_*` are those calls' median
    time and response bytes, and their ratios to the calls for all four, per Run.
    """
    big_total = ctx.pick(full=1024 * MIB, quick=64 * MIB)
    small_total = MIB
    rounds = ctx.pick(full=7, quick=3)
    calls = ctx.pick(full=5, quick=3)
    async with sidecar(ctx.tmp_dir) as server, channel(server.target) as ch:
        runs = {"small": await _new_run(ch, "small"), "big": await _new_run(ch, "big")}
        start = time.perf_counter()
        stored = {
            "small": await _fill(ch, runs["small"], small_total // 1000),
            "big": await _fill(ch, runs["big"], big_total // 1000),
        }
        ctx.log(f"stored {stored['big'] / MIB:.0f} MiB in {time.perf_counter() - start:.0f} s")
        turns = turn_service_pb2_grpc.TurnServiceStub(ch)
        times: dict[str, list[float]] = {"small": [], "big": []}
        one_body: dict[str, list[float]] = {"small": [], "big": []}
        sizes: dict[tuple[str, bool], int] = {}
        for name, run_id in runs.items():
            cold, _ = await _assemble_seconds(turns, run_id)
            ctx.details[f"cold_{name}_ms"] = round(1000 * cold, 1)
        for index in range(rounds):
            order = ["small", "big"] if index % 2 == 0 else ["big", "small"]
            for name in order:
                for _ in range(calls):
                    seconds, sizes[name, False] = await _assemble_seconds(turns, runs[name])
                    times[name].append(seconds)
                    seconds, sizes[name, True] = await _assemble_seconds(
                        turns, runs[name], ONE_BODY
                    )
                    one_body[name].append(seconds)
            ctx.log(
                f"round {index + 1}/{rounds}: small {1000 * statistics.median(times['small']):.0f}"
                f" ms, big {1000 * statistics.median(times['big']):.0f} ms"
            )
    small, big = statistics.median(times["small"]), statistics.median(times["big"])
    ctx.details.update(
        {
            "records_per_run": 2000,
            "stored_bytes_small": stored["small"],
            "stored_bytes_big": stored["big"],
            "median_small_ms": round(1000 * small, 1),
            "median_big_ms": round(1000 * big, 1),
            "calls_per_run": len(times["big"]),
        }
    )
    for name in ("small", "big"):
        one = statistics.median(one_body[name])
        every = statistics.median(times[name])
        ctx.details[f"one_body_median_{name}_ms"] = round(1000 * one, 1)
        ctx.details[f"one_body_time_ratio_{name}"] = round(one / every, 3)
        ctx.details[f"response_bytes_{name}"] = sizes[name, False]
        ctx.details[f"one_body_response_bytes_{name}"] = sizes[name, True]
        ctx.details[f"one_body_bytes_ratio_{name}"] = round(
            sizes[name, True] / sizes[name, False], 3
        )
    return big / small


# Prefix stability


def _cache_blocks(body: bytes) -> list[bytes]:
    """An Anthropic request as its prompt cache reads it: tools, system blocks, then every
    message's blocks with their role. cache_control markers are not content: left out."""
    parsed = json.loads(body)

    def block(value: dict[str, Any], where: str) -> bytes:
        content = {k: v for k, v in value.items() if k != "cache_control"}
        return json.dumps([where, content], separators=(",", ":"), ensure_ascii=False).encode()

    blocks = [block(tool, "tool") for tool in parsed.get("tools", [])]
    blocks += [block(item, "system") for item in parsed.get("system", [])]
    for message in parsed["messages"]:
        blocks += [block(item, message["role"]) for item in message["content"]]
    return blocks


def _prefix_share(previous: list[bytes], current: list[bytes]) -> float:
    """Bytes of the leading blocks identical to the previous call's, over the previous
    call's bytes."""
    shared = 0
    for before, now in zip(previous, current, strict=False):
        if before != now:
            break
        shared += len(before)
    return shared / sum(len(b) for b in previous)


class _NaiveAssembly:
    """What assembly looks like without the zone discipline, over the same log: the clock
    at the top of the system prompt, and every result elided except the current step's."""

    def __init__(self, tools: list[dict[str, Any]], system: str) -> None:
        self.tools = tools
        self.system = system
        self.messages: list[dict[str, Any]] = []

    def add(self, role: str, blocks: list[dict[str, Any]]) -> None:
        if self.messages and self.messages[-1]["role"] == role:
            self.messages[-1]["content"].extend(blocks)
        else:
            self.messages.append({"role": role, "content": blocks})

    def body(self, clock: str, current: set[str]) -> bytes:
        messages = []
        for message in self.messages:
            content = []
            for item in message["content"]:
                if item["type"] == "tool_result" and item["tool_use_id"] not in current:
                    text = item["content"][0]["text"]
                    if len(text) > 1500:
                        text = text[:1000] + "\n...\n" + text[-500:]
                    item = {**item, "content": [{"type": "text", "text": text}]}
                content.append(item)
            messages.append({"role": message["role"], "content": content})
        system = [{"type": "text", "text": f"Current time: {clock}\n\n{self.system}"}]
        return json.dumps({"tools": self.tools, "system": system, "messages": messages}).encode()


@case("prefix_stability_within_turn", unit="ratio", target=">= 0.995")
async def prefix_stability_within_turn(ctx: BenchContext) -> float:
    """Share of the previous call's bytes that lead the next call unchanged, averaged over the
    calls within a turn, on a scripted Run of 20 turns of 8 steps.

    Every step is one AssemblePrompt (the clock advancing 20 s per call) followed by the
    model's tool call and its result; one result in four is huge (256 KiB), the rest 200 B
    to 4 KiB. Blocks are compared in the Anthropic cache's order (tools, system blocks,
    messages), cache_control markers left out. Details give the same figure at turn
    boundaries, and both figures for a naive assembly of the same log (clock in the system
    prompt, elision boundary before the current step), the smallest within-turn share, and
    the context guard's actions: results it elided (two or three huge results in one turn
    cross the default 200,000-token window) and the within-turn calls whose prefix it broke.
    """
    turns_count = ctx.pick(full=20, quick=6)
    steps = 8
    huge = ctx.pick(full=256 * 1024, quick=64 * 1024)
    rng = random.Random(20261201)
    async with sidecar(ctx.tmp_dir) as server, channel(server.target) as ch:
        run_id = await _new_run(ch, "prefix")
        turns = turn_service_pb2_grpc.TurnServiceStub(ch)
        naive: _NaiveAssembly | None = None
        within: list[float] = []
        boundary: list[float] = []
        naive_within: list[float] = []
        naive_boundary: list[float] = []
        previous: list[bytes] | None = None
        previous_naive: list[bytes] | None = None
        guarded: set[str] = set()
        guard_misses = 0
        clock = NOON
        for turn in range(turns_count):
            question = f"Turn {turn}: find the failing worker."
            await _append(ch, run_id, [_user(question)])
            current_step: set[str] = set()
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
                body = json.loads(response.anthropic_request_json)
                if naive is None:
                    naive = _NaiveAssembly(body["tools"], body["system"][0]["text"])
                    naive.add("user", [{"type": "text", "text": question}])
                elif step == 0:
                    naive.add("user", [{"type": "text", "text": question}])
                blocks = _cache_blocks(response.anthropic_request_json)
                newly = {g.call_id for g in response.context_guard.elided} - guarded
                guarded |= newly
                naive_blocks = _cache_blocks(naive.body(str(clock), current_step))
                if previous is not None and previous_naive is not None:
                    share = _prefix_share(previous, blocks)
                    (boundary if step == 0 else within).append(share)
                    # All but the previous call's transient block kept, or the guard broke it.
                    kept = blocks[: len(previous) - 1] == previous[:-1]
                    guard_misses += step > 0 and not kept and bool(newly)
                    (naive_boundary if step == 0 else naive_within).append(
                        _prefix_share(previous_naive, naive_blocks)
                    )
                previous, previous_naive = blocks, naive_blocks
                call_id = f"t{turn}s{step}"
                size = huge if rng.random() < 0.25 else rng.randint(200, 4096)
                output = _log_text(size, turn * steps + step)
                await _append(ch, run_id, [_assistant("", [call_id]), _result(call_id, output)])
                naive.add(
                    "assistant",
                    [{"type": "tool_use", "id": call_id, "name": "run_query", "input": {"q": 1}}],
                )
                naive.add(
                    "user",
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": call_id,
                            "content": [{"type": "text", "text": output}],
                        }
                    ],
                )
                current_step = {call_id}
    value = statistics.fmean(within)
    ctx.details.update(
        {
            "turns": turns_count,
            "steps_per_turn": steps,
            "within_turn_calls": len(within),
            "at_turn_boundary": round(statistics.fmean(boundary), 4),
            "naive_within_turn": round(statistics.fmean(naive_within), 4),
            "naive_at_turn_boundary": round(statistics.fmean(naive_boundary), 4),
            "min_within_turn": round(min(within), 4),
            "guard_elided_results": len(guarded),
            "guard_misses_within_turn": guard_misses,
        }
    )
    return value


# The estimator


@case("estimator_mb_per_s", unit="MB/s", target=">= 200")
def estimator_mb_per_s(ctx: BenchContext) -> float:
    """The token estimator's throughput over text, in MB (10^6 UTF-8 bytes) per second.

    64 KiB chunks of ASCII log text and of mixed-script text (a third of the volume),
    estimated in process; the median of several rounds.
    """
    total = ctx.pick(full=256 * MIB, quick=32 * MIB)
    ascii_chunk = _log_text(64 * 1024, 1)
    mixed_chunk = ("Grüße, 世界! Привет 🙂 " * 4000)[: 64 * 1024 // 3]
    chunks = [ascii_chunk, ascii_chunk, mixed_chunk]
    chunk_bytes = sum(len(c.encode()) for c in chunks)
    repeats = total // chunk_bytes
    rates = []
    for _ in range(ctx.pick(full=7, quick=3)):
        tokens = 0
        start = time.perf_counter()
        for _ in range(repeats):
            for chunk in chunks:
                tokens += estimate_text_tokens(chunk)
        seconds = time.perf_counter() - start
        if tokens <= 0:
            raise AssertionError("the estimator returned nothing")
        rates.append(repeats * chunk_bytes / seconds / 1e6)
    ctx.details.update(
        {"bytes_per_round": repeats * chunk_bytes, "rounds_mb_per_s": [round(r) for r in rates]}
    )
    return statistics.median(rates)

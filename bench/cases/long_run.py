"""A Run that outlives the context window: a seeded 1,000-turn conversation driven through the
sidecar by a host that compacts whenever AssemblePrompt proposes it (docs/prompt.md,
"Compaction").

The trace is drawn from a seed: each turn a user message (200 to 4,000 characters), zero to
three model steps each calling a host tool whose result is 300 to 24,000 characters (one in
forty 120,000), and an answer (200 to 3,000 characters), in a 200,000-token window. The
host's summary is 6,000 characters. A turn is completed when every AssemblePrompt of it
answered with every body within the budget.

The Spec is the one a host publishes for a long Run (`LONG_RUN_SPEC`): since compaction loses
nothing (read_history, read_tool_output), it compacts early, at 20,000 tokens, keeping one
turn verbatim; prior-turn results over 1,000 tokens become previews (per batch 2,000); a
current-turn result over 25,000 tokens (the comparison host's cap) is sent as its preview.
The prompt's size, not the window, then sets what every call costs (docs/prompt.md,
"Measured: a 1,000-turn Run").

The same replay is billed (bench/cases/_long_run_hosts.py): the sidecar-driven host, a
best-practice host that compacts as Anthropic does and loses the compacted span, and the
ideal (`billed_input_ratio_vs_compacting_host`, `billed_input_ratio_vs_ideal_long`).

The four cases share one replay per size (`_replay`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from bench._proc import channel, sidecar
from bench.cases._long_run_hosts import CompactingHost, LongRunBills, words
from bench.cases.prompt_budget import NOON, _append, _cache_blocks, _log_text, _result, _user
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

SEED = 20261204
WINDOW = 200_000
MAX_TOKENS = 4_096
SUMMARY_CHARS = 6_000
# The Spec of a long Run (see the module's docstring).
LONG_RUN_SPEC = spec_pb2.Spec(
    name="long-run",
    version=1,
    instructions="You answer questions about the service's logs.",
    compaction=spec_pb2.CompactionPolicy(trigger_tokens=20_000, keep_recent_turns=1),
    thresholds=spec_pb2.Thresholds(per_result_tokens=1_000, per_batch_tokens=2_000),
    context_budget=spec_pb2.ContextBudget(current_turn_result_tokens=25_000),
)


@dataclass
class Replay:
    turns: int
    completed: int = 0
    calls: int = 0
    compactions: int = 0
    # Calls whose Anthropic body does not start with the previous call's blocks (less its
    # transient block): within a turn, and where a compaction came first (at a turn's first
    # call, against the previous turn's last call).
    within_turn_breaks: int = 0
    compaction_breaks: int = 0
    max_tokens_seen: int = 0
    summary_calls_max_tokens: int = 0
    records: int = 0
    failures: list[str] = field(default_factory=list)
    # What the same trace costs in billed input for the sidecar's host, a compacting host
    # without the sidecar and the ideal (bench/cases/_long_run_hosts.py).
    bills: LongRunBills = field(default_factory=LongRunBills)
    bills_printed: bool = False


_REPLAYS: dict[bool, Replay] = {}


def _assistant(text: str, call_id: str = "") -> run_pb2.Record:
    calls = (
        [content_pb2.ToolCall(call_id=call_id, name="run_query", arguments_json='{"q": 1}')]
        if call_id
        else []
    )
    content = [content_pb2.ContentPart(text=text)] if text else []
    return run_pb2.Record(
        assistant_message=run_pb2.AssistantMessage(content=content, tool_calls=calls)
    )


def _tokens(body: bytes) -> int:
    return -(-len(body) // 4)


def _prefix_kept(previous: bytes, current: bytes) -> bool:
    before, after = _cache_blocks(previous), _cache_blocks(current)
    return after[: len(before) - 1] == before[:-1]


async def _replay(ctx: BenchContext) -> Replay:
    if ctx.quick in _REPLAYS:
        return _REPLAYS[ctx.quick]
    turns_count = ctx.pick(full=1_000, quick=150)
    rng = random.Random(SEED)
    replay = Replay(turns_count)
    budget = WINDOW - MAX_TOKENS
    clock = NOON
    async with sidecar(ctx.tmp_dir) as server, channel(server.target) as ch:
        specs = spec_service_pb2_grpc.SpecServiceStub(ch)
        await specs.PublishSpec(spec_service_pb2.PublishSpecRequest(spec=LONG_RUN_SPEC), timeout=60)
        runs = run_service_pb2_grpc.RunServiceStub(ch)
        created = await runs.CreateRun(
            run_service_pb2.CreateRunRequest(tenant="bench", spec_name="long-run", spec_version=1),
            timeout=60,
        )
        run_id = created.run.run_id
        turns = turn_service_pb2_grpc.TurnServiceStub(ch)
        compaction_ids = iter(range(10**9))
        bills = replay.bills
        bills.compacting = CompactingHost(summary_chars=SUMMARY_CHARS)

        async def call(previous: Any, turn_before: Any = None) -> tuple[Any, bool]:
            """One model call: compact while proposed; the response and whether a
            compaction came first. `previous` is the turn's call before it, `turn_before`
            (at a turn's first call) the previous turn's last."""
            nonlocal clock
            compacted = False
            while True:
                clock += 7
                response = await turns.AssemblePrompt(
                    turn_service_pb2.AssemblePromptRequest(
                        run_id=run_id,
                        now=timestamp_pb2.Timestamp(seconds=clock),
                        model="m",
                        max_tokens=MAX_TOKENS,
                    ),
                    timeout=600,
                )
                replay.calls += 1
                if not response.HasField("compaction"):
                    break
                proposal = response.compaction
                replay.bills.sidecar_summary_call(proposal.anthropic_request_json)
                for body in (
                    proposal.anthropic_request_json,
                    proposal.openai_request_json,
                    proposal.openai_responses_request_json,
                    proposal.gemini_request_json,
                ):
                    replay.summary_calls_max_tokens = max(
                        replay.summary_calls_max_tokens, _tokens(body)
                    )
                summary = run_pb2.Record(
                    compaction=run_pb2.Compaction(
                        # Its own random source, so the trace is the same whatever the
                        # number of compactions.
                        summary=[
                            content_pb2.ContentPart(
                                text=words(SUMMARY_CHARS, random.Random(replay.compactions))
                            )
                        ],
                        first_sequence=proposal.first_sequence,
                        last_sequence=proposal.last_sequence,
                    )
                )
                await runs.AppendRecords(
                    run_service_pb2.AppendRecordsRequest(
                        run_id=run_id,
                        request_id=f"compaction-{next(compaction_ids)}",
                        records=[summary],
                    ),
                    timeout=60,
                )
                replay.compactions += 1
                compacted = True
            replay.bills.sidecar_call(response.anthropic_request_json)
            if not bills.compacting.system:
                bills.compacting.system = "\n\n".join(
                    f"# {s.title}\n\n{s.text}" for s in response.prompt.static_sections
                )
            bills.compacting.call()
            largest = max(
                _tokens(response.anthropic_request_json),
                _tokens(response.openai_request_json),
                _tokens(response.openai_responses_request_json),
                _tokens(response.gemini_request_json),
            )
            replay.max_tokens_seen = max(replay.max_tokens_seen, largest)
            if largest > budget:
                replay.failures.append(f"a body of {largest} tokens")
            before = previous
            if before is None and compacted:
                # A compaction at the turn's first call: its rewrite, against the previous
                # turn's last call.
                before = turn_before
            if before is not None:
                kept = _prefix_kept(before.anthropic_request_json, response.anthropic_request_json)
                if not kept and compacted:
                    replay.compaction_breaks += 1
                elif not kept:
                    replay.within_turn_breaks += 1
            return response, compacted

        previous = None
        for number in range(1, turns_count + 1):
            ok = True
            failures = len(replay.failures)
            question = f"Turn {number}. " + words(rng.randint(200, 4_000), rng)
            await _append(ch, run_id, [_user(question)])
            bills.compacting.user(question)
            turn_before, previous = previous, None
            try:
                previous, _ = await call(None, turn_before)
                for step in range(rng.randint(0, 3)):
                    call_id = f"t{number}s{step}"
                    size = 120_000 if rng.random() < 1 / 40 else rng.randint(300, 24_000)
                    output = _log_text(size, number)
                    await _append(ch, run_id, [_assistant("", call_id), _result(call_id, output)])
                    bills.compacting.tool_step(call_id, output)
                    previous, _ = await call(previous)
            except grpc.aio.AioRpcError as error:  # a refused call: the turn is not completed
                replay.failures.append(f"turn {number}: {error.code().name} {error.details()}")
                ok = False
            answer = f"Answer {number}. " + words(rng.randint(200, 3_000), rng)
            await _append(ch, run_id, [_assistant(answer)])
            bills.compacting.answer(answer)
            if ok and len(replay.failures) == failures:
                replay.completed += 1
            if number % 100 == 0:
                ctx.log(f"turn {number}: {replay.compactions} compactions, {replay.calls} calls")
        listed = 0
        token = ""
        while True:
            page = await runs.ListRecords(
                run_service_pb2.ListRecordsRequest(run_id=run_id, page_token=token), timeout=600
            )
            listed += len(page.records)
            token = page.next_page_token
            if not token:
                break
        replay.records = listed
    _REPLAYS[ctx.quick] = replay
    return replay


def _details(ctx: BenchContext, replay: Replay) -> None:
    ctx.details.update(
        {
            "turns": replay.turns,
            "completed": replay.completed,
            "calls": replay.calls,
            "compactions": replay.compactions,
            "within_turn_breaks_without_compaction": replay.within_turn_breaks,
            "breaks_at_a_compaction": replay.compaction_breaks,
            "max_request_tokens": replay.max_tokens_seen,
            "max_summary_call_tokens": replay.summary_calls_max_tokens,
            "budget_tokens": WINDOW - MAX_TOKENS,
            "records_listed": replay.records,
            "failures": replay.failures[:5],
        }
    )


@case("long_run_turns_completed", unit="turns", target=">= 1000")
async def long_run_turns_completed(ctx: BenchContext) -> float:
    """Turns of the seeded 1,000-turn trace (`--quick`: 150, target then unmet by design)
    completed with every request within the 200,000-token window less max_tokens, by a host
    that compacts whenever AssemblePrompt proposes it (`LONG_RUN_SPEC`). Details: calls,
    compactions, the largest request and summary call, the records ListRecords returns at
    the end (every one kept)."""
    replay = await _replay(ctx)
    _details(ctx, replay)
    return float(replay.completed)


@case("compaction_prefix_rewrites", unit="per compaction", target="<= 1")
async def compaction_prefix_rewrites(ctx: BenchContext) -> float:
    """In the same replay: the calls whose Anthropic body (blocks in cache order,
    cache_control left out) does not start with the previous call's less its transient
    block — a compaction's own rewrite (compactions land at a turn's first call: against the
    previous turn's last call) and any break within a turn — per compaction."""
    replay = await _replay(ctx)
    _details(ctx, replay)
    breaks = replay.within_turn_breaks + replay.compaction_breaks
    return breaks / max(replay.compactions, 1)


def _bills(ctx: BenchContext, replay: Replay) -> LongRunBills:
    _details(ctx, replay)
    ctx.details["billed_input"] = replay.bills.figures()
    if not replay.bills_printed:
        replay.bills_printed = True
        for line in replay.bills.table():
            ctx.log(line)
    return replay.bills


@case("billed_input_ratio_vs_compacting_host", unit="ratio", target=">= 2")
async def billed_input_ratio_vs_compacting_host(ctx: BenchContext) -> float:
    """In the same replay: the billed-input equivalent of the best-practice host that compacts
    as Anthropic does (tool search, results capped at 25,000 tokens, compaction at 150,000
    tokens after which only its summary is left, its summary calls billed) over the
    sidecar-driven host's (its summary calls billed too). Anthropic's cache simulated for both
    as in billed_input.py. Details: each host's bill, by block kind too."""
    bills = _bills(ctx, await _replay(ctx))
    return bills.compacting.bill.billed / bills.sidecar.billed


@case("billed_input_ratio_vs_ideal_long", unit="ratio", target="<= 1.2")
async def billed_input_ratio_vs_ideal_long(ctx: BenchContext) -> float:
    """In the same replay: the sidecar-driven host's billed-input equivalent over the ideal's:
    the same bodies and summary calls under a perfect cache (every byte written once, read
    by every later call that starts with it)."""
    bills = _bills(ctx, await _replay(ctx))
    return bills.sidecar.billed / bills.ideal.billed

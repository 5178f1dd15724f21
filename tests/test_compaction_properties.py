"""A property test (hypothesis) of compaction over generated long Runs, policies and budgets,
driven through the real server on both databases by a host that compacts whenever
AssemblePrompt proposes it: every request fits its budget, every compaction starts and ends
at turn boundaries, within a turn each call's body is a byte prefix of the next (but for its
transient block) unless a compaction or the context guard came between, a compaction past a
turn's first call is only ever required, every record stays readable, and a fact planted in
turn 3 is found by read_history at the end."""

from __future__ import annotations

import itertools
import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

from google.protobuf import timestamp_pb2
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from psych.sidecar.v1 import run_pb2, run_service_pb2, spec_pb2, turn_service_pb2
from tests.support.prompts import append, assemble, assistant, dispatch, read, result, run_with
from tests.support.requests import all_records, text_part, user
from tests.support.sidecar import Stubs

# One transport is enough: compaction does not depend on the socket.
SIDECAR_TRANSPORTS = ["unix"]

RESERVE = 1_000
_names = itertools.count()


@dataclass(frozen=True)
class Turn:
    user_chars: int
    results: tuple[int, ...]  # one tool call and its result per step
    answer_chars: int


TURNS = st.lists(
    st.builds(
        Turn,
        st.integers(20, 3_000),
        st.lists(st.integers(50, 8_000), max_size=2).map(tuple),
        st.integers(20, 2_000),
    ),
    min_size=8,
    max_size=30,
)
POLICIES = st.builds(
    spec_pb2.CompactionPolicy,
    trigger_fraction=st.floats(0.3, 0.9),
    keep_recent_turns=st.integers(0, 3),
    summary_max_tokens=st.integers(100, 1_000),
)


def _blocks(body: bytes) -> list[bytes]:
    """An Anthropic request as its cache reads it, cache_control left out."""
    parsed = json.loads(body)
    blocks: list[Any] = [["tool", t] for t in parsed.get("tools", [])]
    blocks += [["system", b] for b in parsed.get("system", [])]
    for message in parsed["messages"]:
        blocks += [[message["role"], b] for b in message["content"]]
    for block in blocks:
        block[1] = {k: v for k, v in block[1].items() if k != "cache_control"}
    return [json.dumps(b, separators=(",", ":")).encode() for b in blocks]


class Host:
    """A host that compacts whenever AssemblePrompt proposes it."""

    def __init__(self, stubs: Stubs, run_id: str, window: int) -> None:
        self.stubs = stubs
        self.run_id = run_id
        self.budget = spec_pb2.ContextBudget(
            context_window_tokens=window, output_reserve_tokens=RESERVE
        )
        self.limit = window - RESERVE
        self.covered = 0  # the last record compacted so far
        self.compactions = itertools.count()
        self.clock = itertools.count()
        self.previous: turn_service_pb2.AssemblePromptResponse | None = None

    def new_turn(self) -> None:
        self.previous = None

    def call(self) -> turn_service_pb2.AssemblePromptResponse:
        compacted = False
        for _ in range(100):
            now = timestamp_pb2.Timestamp(seconds=1_796_126_400 + next(self.clock))
            response = assemble(self.stubs, self.run_id, context_budget=self.budget, now=now)
            if not response.HasField("compaction"):
                break
            # Within a turn nothing moves: past its first call, a compaction is proposed only
            # to a call that would not fit.
            assert self.previous is None or response.compaction.required
            self.compact(response.compaction)
            compacted = True
        else:
            raise AssertionError("compaction never settled")
        assert response.context_guard.estimated_tokens <= self.limit
        for body in (
            response.anthropic_request_json,
            response.openai_request_json,
            response.openai_responses_request_json,
            response.gemini_request_json,
        ):
            assert math.ceil(len(body) / 4) <= self.limit
        if self.previous is not None and not compacted and not response.context_guard.elided:
            before = _blocks(self.previous.anthropic_request_json)
            after = _blocks(response.anthropic_request_json)
            assert after[: len(before) - 1] == before[:-1]
        self.previous = response
        return response

    def compact(self, proposal: turn_service_pb2.CompactionProposal) -> None:
        records = all_records(self.stubs, self.run_id)
        first, last = proposal.first_sequence, proposal.last_sequence
        assert first == self.covered + 1
        assert first == 1 or records[first - 1].WhichOneof("kind") == "user_message"
        assert records[last].WhichOneof("kind") == "user_message"  # record last + 1
        for body in (
            proposal.anthropic_request_json,
            proposal.openai_request_json,
            proposal.openai_responses_request_json,
            proposal.gemini_request_json,
        ):
            assert math.ceil(len(body) / 4) <= self.limit
        record = run_pb2.Record(
            compaction=run_pb2.Compaction(
                summary=[text_part(f"Summary of records {first} to {last}.")],
                first_sequence=first,
                last_sequence=last,
            )
        )
        request = run_service_pb2.AppendRecordsRequest(
            run_id=self.run_id, request_id=f"compaction-{next(self.compactions)}", records=[record]
        )
        answer = self.stubs.runs.AppendRecords(request)
        assert self.stubs.runs.AppendRecords(request) == answer  # a retry appends once
        self.covered = last


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    turns=TURNS,
    policy=POLICIES,
    window=st.integers(8_000, 20_000),
    code=st.integers(1_000, 9_999),
)
# Turns that fill the window every few turns: many compactions, some required mid-turn.
@example(
    turns=[Turn(3_000, (8_000, 8_000), 2_000)] * 20,
    policy=spec_pb2.CompactionPolicy(
        trigger_fraction=0.5, keep_recent_turns=1, summary_max_tokens=500
    ),
    window=9_000,
    code=4242,
)
def test_a_compacting_host_keeps_every_promise(
    stubs: Stubs, turns: list[Turn], policy: spec_pb2.CompactionPolicy, window: int, code: int
) -> None:
    name = f"agent-{uuid.uuid4().hex[:8]}-{next(_names)}"
    run_id = run_with(stubs, name, instructions="Be helpful.", compaction=policy)
    host = Host(stubs, run_id, window)
    fact = f"The vault code is {code}."
    appended = 0
    handles: list[tuple[str, str]] = []
    calls = itertools.count()
    for number, turn in enumerate(turns, 1):
        said = fact if number == 3 else f"Turn {number}."
        append(stubs, run_id, user(f"{said} " + "u" * turn.user_chars))
        appended += 1
        host.new_turn()
        host.call()
        for size in turn.results:
            call_id = f"c{next(calls)}"
            append(stubs, run_id, assistant("", (call_id, "lookup", "{}")))
            text = f"{call_id}: " + "r" * size
            (record,) = append(stubs, run_id, result(call_id, text))
            handles.append((record.handle, text))
            appended += 2
            host.call()
        append(stubs, run_id, assistant(f"Answer {number}. " + "a" * turn.answer_chars))
        appended += 1
    records = all_records(stubs, run_id)
    kinds = [r.WhichOneof("kind") for r in records]
    assert len(records) - kinds.count("compaction") == appended
    for handle, text in handles:
        assert read(stubs, run_id, handle, limit=len(text)).text == text
    third = [i + 1 for i, kind in enumerate(kinds) if kind == "user_message"][2]
    event(f"compactions: {kinds.count('compaction')}")
    event(f"turn 3 compacted: {host.covered >= third}")
    if host.covered >= third:
        found = dispatch(stubs, run_id, "history", "read_history", {"grep": "vault code"})
        blocks = json.loads(found.outcome.result_json)["content"]
        assert f"#{third} (turn 3): {fact}" in blocks[0]["text"]

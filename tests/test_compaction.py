"""Compaction over the real server on both databases: the Spec's policy (checked at publish,
overridden per call), AssemblePrompt's proposal (range at turn boundaries, summary bodies
that are the would-be call with the summary request in place of the transient message), the
compaction record (retry-safe, checked against the log), zone 3 after it, read_history and
the handles of compacted results."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

import grpc
import pytest
import sqlalchemy as sa

from psych.sidecar.v1 import (
    run_pb2,
    run_service_pb2,
    spec_pb2,
    turn_pb2,
    usage_service_pb2,
    usage_service_pb2_grpc,
)
from psych_sidecar.domain.calls.history import HistoryReader
from psych_sidecar.domain.runlog import ContentPart, PartMeta, RecordSkeleton
from psych_sidecar.storage.log_reads import SqlLogReader
from tests.support.prompts import (
    append,
    assemble,
    assistant,
    dispatch,
    read,
    result,
    run_with,
    valid_anthropic,
    valid_gemini,
    valid_openai,
    valid_openai_responses,
)
from tests.support.requests import all_records, publish, text_part, user
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

# One transport is enough: compaction does not depend on the socket.
SIDECAR_TRANSPORTS = ["unix"]

POLICY = spec_pb2.CompactionPolicy(trigger_tokens=2_000, keep_recent_turns=1)
FACT = "The vault code is 7431-ZEBRA."


def compaction(summary: str, first: int, last: int) -> run_pb2.Record:
    return run_pb2.Record(
        compaction=run_pb2.Compaction(
            summary=[text_part(summary)], first_sequence=first, last_sequence=last
        )
    )


def long_run(stubs: Stubs, run_id: str, turns: int, size: int = 2_000) -> None:
    """`turns` turns of a user message, an assistant's tool call, its result and an answer,
    each about `size` characters; the fact is planted in turn 3."""
    for index in range(1, turns + 1):
        said = FACT if index == 3 else f"Question {index}."
        append(stubs, run_id, user(said + " " + "u" * size))
        append(stubs, run_id, assistant("", (f"c{index}", "lookup", '{"q": 1}')))
        append(stubs, run_id, result(f"c{index}", f"result {index} " + "r" * size))
        append(stubs, run_id, assistant(f"Answer {index}. " + "a" * size))


def asking_after_four_turns(
    stubs: Stubs, unique: Callable[[str], str], policy: spec_pb2.CompactionPolicy, **spec: str
) -> str:
    """A Run of four turns (long_run) and a fifth turn's question: its first call."""
    run_id = run_with(stubs, unique("agent"), compaction=policy, **spec)
    long_run(stubs, run_id, 4)
    append(stubs, run_id, user("And now?"))
    return run_id


# The policy in the Spec


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (spec_pb2.CompactionPolicy(trigger_tokens=0), "spec.compaction.trigger_tokens"),
        (spec_pb2.CompactionPolicy(trigger_fraction=0), "spec.compaction.trigger_fraction"),
        (spec_pb2.CompactionPolicy(trigger_fraction=1.5), "spec.compaction.trigger_fraction"),
        (
            spec_pb2.CompactionPolicy(trigger_tokens=10, trigger_fraction=0.5),
            "spec.compaction.trigger_fraction",
        ),
        (
            spec_pb2.CompactionPolicy(trigger_tokens=10, keep_recent_turns=-1),
            "spec.compaction.keep_recent_turns",
        ),
        (
            spec_pb2.CompactionPolicy(trigger_tokens=10, summary_max_tokens=0),
            "spec.compaction.summary_max_tokens",
        ),
        (
            spec_pb2.CompactionPolicy(trigger_tokens=10, summary_instructions="a\x00b"),
            "spec.compaction.summary_instructions",
        ),
    ],
)
def test_a_bad_policy_is_refused_at_publish(
    stubs: Stubs, unique: Callable[[str], str], policy: spec_pb2.CompactionPolicy, field: str
) -> None:
    failure = rpc_failure(lambda: publish(stubs, unique("agent"), compaction=policy))
    assert failure.code is grpc.StatusCode.INVALID_ARGUMENT
    assert failure.info.reason == "FIELD_INVALID"
    assert failure.info.metadata["field"] == field


def test_a_policy_without_a_trigger_is_refused(stubs: Stubs, unique: Callable[[str], str]) -> None:
    policy = spec_pb2.CompactionPolicy(keep_recent_turns=3)
    failure = rpc_failure(lambda: publish(stubs, unique("agent"), compaction=policy))
    assert failure.info.reason == "FIELD_REQUIRED"
    assert failure.info.metadata["field"] == "spec.compaction.trigger_tokens"


def test_the_policy_round_trips_and_offers_read_history(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    policy = spec_pb2.CompactionPolicy(trigger_fraction=0.75, summary_instructions="Keep ids.")
    spec = publish(stubs, unique("agent"), compaction=policy)
    assert spec.compaction == policy
    with_policy = run_with(stubs, unique("agent"), compaction=policy)
    without = run_with(stubs, unique("agent"))
    for run_id in (with_policy, without):
        append(stubs, run_id, user("hi"))
    tools = [t.name for t in assemble(stubs, with_policy).prompt.tools.tools]
    assert tools == ["read_history", "read_tool_output"]
    kinds = [t.kind for t in assemble(stubs, with_policy).prompt.tools.tools]
    assert turn_pb2.EXPOSED_TOOL_KIND_READ_HISTORY in kinds
    assert [t.name for t in assemble(stubs, without).prompt.tools.tools] == ["read_tool_output"]


def test_an_override_on_a_spec_without_a_policy_is_refused(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    append(stubs, run_id, user("hi"))
    override = spec_pb2.CompactionPolicy(trigger_tokens=10)
    failure = rpc_failure(lambda: assemble(stubs, run_id, compaction=override))
    assert failure.info.reason == "FIELD_INVALID"
    assert failure.info.metadata["field"] == "compaction"
    bad = spec_pb2.CompactionPolicy(trigger_fraction=2)
    failure = rpc_failure(lambda: assemble(stubs, run_id, compaction=bad))
    assert failure.info.metadata["field"] == "compaction.trigger_fraction"


# The proposal


def test_no_proposal_under_the_trigger_and_one_over_it(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    quiet = spec_pb2.CompactionPolicy(trigger_tokens=1_000_000, keep_recent_turns=1)
    run_id = asking_after_four_turns(stubs, unique, quiet, instructions="Be brief.")
    assert not assemble(stubs, run_id).HasField("compaction")
    # The call's override sets another trigger: the Spec's is replaced, field by field.
    override = spec_pb2.CompactionPolicy(trigger_fraction=0.01)
    response = assemble(stubs, run_id, compaction=override)
    proposal = response.compaction
    assert not proposal.required
    assert proposal.trigger_tokens == int(0.01 * (200_000 - 4096))
    records = all_records(stubs, run_id)
    # Turns 1 to 3 are compacted, turn 4 (kept) and the current turn stay.
    assert (proposal.first_sequence, proposal.last_sequence) == (1, 12)
    assert (proposal.first_turn, proposal.last_turn) == (1, 3)
    assert records[proposal.last_sequence].WhichOneof("kind") == "user_message"
    assert response.anthropic_request_json  # the call fits: its own bodies are there too


def test_a_compaction_is_proposed_at_a_turns_first_call_and_mid_turn_only_when_required(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = asking_after_four_turns(stubs, unique, POLICY, instructions="Be brief.")
    opening = assemble(stubs, run_id)
    assert opening.compaction.last_sequence == 12
    assert not opening.compaction.required
    # The host puts it off: the turn's later calls are over the trigger too, but fit, so
    # nothing moves within the turn: no proposal, and each body starts with the one before.
    append(stubs, run_id, assistant("", ("c5", "lookup", '{"q": 5}')))
    append(stubs, run_id, result("c5", "result 5 " + "r" * 2_000))
    later = assemble(stubs, run_id)
    assert later.context_guard.estimated_tokens > POLICY.trigger_tokens
    assert not later.HasField("compaction")
    cut = opening.anthropic_request_json.index(b'"And now?"') + len(b'"And now?"')
    assert later.anthropic_request_json[:cut] == opening.anthropic_request_json[:cut]
    # A later call that would not fit is still required to compact.
    budget = spec_pb2.ContextBudget(context_window_tokens=4_000, output_reserve_tokens=500)
    required = assemble(stubs, run_id, context_budget=budget)
    assert required.compaction.required
    assert not required.anthropic_request_json
    # The next turn's first call is proposed the compaction again.
    append(stubs, run_id, assistant("Answer 5."))
    append(stubs, run_id, user("Next?"))
    assert assemble(stubs, run_id).compaction.last_sequence == 16


def _last_text(body: dict[str, object]) -> str:
    messages = body["messages"]
    assert isinstance(messages, list)
    content = messages[-1]["content"]
    return str(content[-1]["text"] if isinstance(content, list) else content)


def test_the_summary_call_is_the_would_be_call_with_the_request_in_place_of_the_transient(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = asking_after_four_turns(stubs, unique, POLICY, instructions="Be brief.")
    response = assemble(stubs, run_id, transient_note="Keep it short.")
    proposal = response.compaction
    call = json.loads(response.anthropic_request_json)
    summary = valid_anthropic(proposal.anthropic_request_json)
    transient, request = _last_text(call), _last_text(summary)
    assert request.startswith("[Compaction request]")
    assert 'the user message that begins "Question 4.' in request

    def swapped(body: bytes) -> bytes:
        old = json.dumps(transient, ensure_ascii=False).encode()
        new = json.dumps(request, ensure_ascii=False).encode()
        assert body.count(old) == 1
        return body.replace(old, new)

    assert swapped(response.anthropic_request_json) == proposal.anthropic_request_json
    assert swapped(response.openai_request_json) == proposal.openai_request_json
    assert swapped(response.gemini_request_json) == proposal.gemini_request_json
    assert swapped(response.openai_responses_request_json) == proposal.openai_responses_request_json
    # So each starts with the same bytes as the call up to its transient text.
    head = response.anthropic_request_json.index(json.dumps(transient).encode())
    assert proposal.anthropic_request_json[:head] == response.anthropic_request_json[:head]
    valid_openai(proposal.openai_request_json)
    valid_openai_responses(proposal.openai_responses_request_json)
    valid_gemini(proposal.gemini_request_json)


def test_compacting_replaces_the_span_in_zone_three_and_the_log_keeps_everything(
    stubs: Stubs, unique: Callable[[str], str], grpc_channel: grpc.Channel
) -> None:
    run_id = asking_after_four_turns(stubs, unique, POLICY)
    proposal = assemble(stubs, run_id).compaction
    before = len(all_records(stubs, run_id))
    record = compaction("The user asked 3 questions; " + FACT, 1, proposal.last_sequence)
    request = run_service_pb2.AppendRecordsRequest(
        run_id=run_id, request_id="compact-1", records=[record]
    )
    first = stubs.runs.AppendRecords(request)
    # A retry appends nothing more and answers the same.
    assert stubs.runs.AppendRecords(request) == first
    usage = usage_service_pb2_grpc.UsageServiceStub(grpc_channel)
    usage.RecordUsage(
        usage_service_pb2.RecordUsageRequest(
            run_id=run_id, request_id="compact-1", model="m", input_tokens=900, output_tokens=40
        )
    )
    records = all_records(stubs, run_id)
    assert len(records) == before + 1
    stored = records[-1].compaction
    assert (stored.first_sequence, stored.last_sequence) == (1, proposal.last_sequence)
    assert stored.summary[0].text.endswith(FACT)
    kinds = [run_pb2.RECORD_KIND_COMPACTION]
    listed = stubs.runs.ListRecords(run_service_pb2.ListRecordsRequest(run_id=run_id, kinds=kinds))
    assert [r.sequence for r in listed.records] == [first.records[0].sequence]

    response = assemble(stubs, run_id)
    assert not response.HasField("compaction")
    history = response.prompt.history
    opening = history[0].parts[0].content.text
    assert opening.startswith("[Summary of turns 1 to 3 of this conversation")
    assert "read_history" in opening
    assert opening.endswith(FACT)
    texts = [p.content.text for m in history for p in m.parts if p.WhichOneof("kind") == "content"]
    assert not any(t.startswith("Question 1.") for t in texts)
    assert any(t.startswith("Question 4.") for t in texts)
    valid_anthropic(response.anthropic_request_json)
    valid_openai(response.openai_request_json)
    valid_openai_responses(response.openai_responses_request_json)
    valid_gemini(response.gemini_request_json)
    # The compacted results keep their handles.
    handle = next(r.handle for r in records if r.WhichOneof("kind") == "tool_result")
    assert read(stubs, run_id, handle).text.startswith("result 1 ")


def test_a_compaction_record_is_checked_against_the_log(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), compaction=POLICY)
    long_run(stubs, run_id, 3)
    append(stubs, run_id, user("And now?"))

    def refused(*records: run_pb2.Record) -> tuple[str, str]:
        failure = rpc_failure(lambda: append(stubs, run_id, *records))
        return failure.info.reason, failure.info.metadata["field"]

    assert refused(compaction("s", 2, 4)) == (
        "FIELD_INVALID",
        "records[0].compaction.first_sequence",
    )
    assert refused(compaction("s", 1, 3)) == (
        "FIELD_INVALID",
        "records[0].compaction.last_sequence",
    )
    assert refused(compaction("s", 1, 0)) == (
        "FIELD_INVALID",
        "records[0].compaction.last_sequence",
    )
    assert refused(compaction("s", 1, 4), user("x")) == ("FIELD_INVALID", "records")
    empty = run_pb2.Record(compaction=run_pb2.Compaction(first_sequence=1, last_sequence=4))
    assert refused(empty) == ("FIELD_REQUIRED", "records[0].compaction.summary")
    append(stubs, run_id, compaction("first", 1, 4))
    # The next one continues the range; the same range again is accepted (a new summary).
    assert refused(compaction("s", 1, 8)) == (
        "FIELD_INVALID",
        "records[0].compaction.first_sequence",
    )
    append(stubs, run_id, compaction("again", 1, 4))
    append(stubs, run_id, compaction("second", 5, 8))
    opening = assemble(stubs, run_id).prompt.history[0].parts[0].content.text
    assert opening.endswith("\n\nsecond")
    assert "turns 1 to 2" in opening


def test_when_the_call_cannot_fit_compaction_is_required(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    policy = spec_pb2.CompactionPolicy(trigger_fraction=0.9, keep_recent_turns=3)
    run_id = run_with(stubs, unique("agent"), compaction=policy)
    long_run(stubs, run_id, 6, size=4_000)
    append(stubs, run_id, user("And now?"))
    budget = spec_pb2.ContextBudget(context_window_tokens=9_000, output_reserve_tokens=1_000)
    response = assemble(stubs, run_id, context_budget=budget)
    proposal = response.compaction
    assert proposal.required
    assert not response.anthropic_request_json
    assert not response.HasField("prompt")
    for body in (
        proposal.anthropic_request_json,
        proposal.openai_request_json,
        proposal.openai_responses_request_json,
        proposal.gemini_request_json,
    ):
        assert len(body) / 4 <= 8_000
    summary = valid_anthropic(proposal.anthropic_request_json)
    assert _last_text(summary).startswith("[Compaction request] Summarise the conversation above.")
    records = all_records(stubs, run_id)
    assert records[proposal.last_sequence].WhichOneof("kind") == "user_message"
    append(stubs, run_id, compaction("summary", 1, proposal.last_sequence))
    # Until the prompt fits: each compaction continues the previous one.
    for _ in range(6):
        response = assemble(stubs, run_id, context_budget=budget)
        if not response.compaction.required:
            break
        nxt = response.compaction
        append(stubs, run_id, compaction("summary", nxt.first_sequence, nxt.last_sequence))
    assert response.anthropic_request_json
    assert response.context_guard.estimated_tokens <= 8_000


def test_context_budget_exceeded_says_what_to_do(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    budget = spec_pb2.ContextBudget(context_window_tokens=1_500, output_reserve_tokens=500)
    without = run_with(stubs, unique("agent"))
    policy = spec_pb2.CompactionPolicy(trigger_tokens=500, summary_max_tokens=100)
    with_policy = run_with(stubs, unique("agent"), compaction=policy)
    for run_id in (without, with_policy):
        append(stubs, run_id, user("x" * 8_000))
    failure = rpc_failure(lambda: assemble(stubs, without, context_budget=budget))
    assert failure.info.reason == "CONTEXT_BUDGET_EXCEEDED"
    assert "Set a compaction policy" in failure.message
    failure = rpc_failure(lambda: assemble(stubs, with_policy, context_budget=budget))
    assert failure.info.reason == "CONTEXT_BUDGET_EXCEEDED"
    assert "Even a summary of every earlier turn" in failure.message


# read_history


def _text(response: object) -> str:
    outcome = response.outcome  # type: ignore[attr-defined]
    return "".join(block.get("text", "") for block in json.loads(outcome.result_json)["content"])


def test_read_history_reads_and_greps_the_compacted_span(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), compaction=POLICY)
    long_run(stubs, run_id, 4)
    append(stubs, run_id, user("What was the code?"))
    # Before any compaction there is nothing to read.
    assert _text(dispatch(stubs, run_id, "h0", "read_history", {})) == ""
    append(stubs, run_id, compaction("Questions 1 to 3.", 1, 12))
    append(stubs, run_id, assistant("", ("h1", "read_history", '{"grep": "vault code"}')))
    found = _text(dispatch(stubs, run_id, "h1", "read_history", {"grep": "vault code"}))
    assert found.startswith("#9 (turn 3): " + FACT)
    turn = _text(dispatch(stubs, run_id, "h2", "read_history", {"turn": 2}))
    assert turn.startswith("[#5 · turn 2 · user]\nQuestion 2.")
    assert "read_tool_output(handle=" in turn
    assert "tool call lookup" in turn
    # Pages are whole records and say where to go on.
    page = _text(dispatch(stubs, run_id, "h3", "read_history", {"limit": 2_050}))
    assert page.startswith("[#1 · turn 1 · user]\nQuestion 1.")
    assert page.endswith("[More up to record 12: continue with sequence=2.]")
    nothing = [
        {"turn": 9},
        {"sequence": 13},
        {"grep": "no such words"},
    ]
    for index, arguments in enumerate(nothing):
        assert _text(dispatch(stubs, run_id, f"e{index}", "read_history", arguments)) == ""
    for index, arguments in enumerate(
        [{"turn": 1, "sequence": 2}, {"turn": 0}, {"grep": "("}, {"turn": "x"}]
    ):
        response = dispatch(stubs, run_id, f"b{index}", "read_history", arguments)
        assert response.outcome.is_error, arguments
    # The handle a compacted result's line names reads it through the model's tool too.
    handle = turn.split('read_tool_output(handle="')[1].split('"')[0]
    full = _text(dispatch(stubs, run_id, "r1", "read_tool_output", {"handle": handle}))
    assert full.startswith("result 2 ")


class CountingLog(SqlLogReader):
    """The real log reader over the sidecar's database, counting the records its reads hand
    back (skeletons, contents, part shapes; a count or a turn's start as one)."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        self.records = 0

    def record_skeletons(self, run_id: str) -> list[RecordSkeleton]:
        found = super().record_skeletons(run_id)
        self.records += len(found)
        return found

    def record_skeletons_between(
        self, run_id: str, first: int, last: int, limit: int
    ) -> list[RecordSkeleton]:
        found = super().record_skeletons_between(run_id, first, last, limit)
        self.records += len(found)
        return found

    def record_contents(
        self, run_id: str, sequences: Sequence[int]
    ) -> dict[int, tuple[ContentPart, ...]]:
        found = super().record_contents(run_id, sequences)
        self.records += len(found)
        return found

    def part_metas(self, run_id: str, sequences: Sequence[int]) -> dict[int, list[PartMeta]]:
        found = super().part_metas(run_id, sequences)
        self.records += len(found)
        return found

    def turn_of(self, run_id: str, sequence: int) -> int:
        self.records += 1
        return super().turn_of(run_id, sequence)

    def turn_starts(self, run_id: str, turn: int, count: int) -> list[int]:
        found = super().turn_starts(run_id, turn, count)
        self.records += len(found)
        return found


def test_a_turn_read_fetches_the_records_it_shows_whatever_the_runs_length(
    grpc_server: RunningSidecar, stubs: Stubs, unique: Callable[[str], str]
) -> None:
    """Work scales with what is sent, not with what is stored: reading turn 2 (or from its
    first record on, one page) of a 5-turn Run and of a 60-turn Run reads as many records."""
    engine = sa.create_engine(grpc_server.settings.resolved_database_url())
    counted: dict[int, tuple[int, int, int]] = {}
    pages: dict[int, tuple[str, ...]] = {}
    try:
        for turns in (5, 60):
            run_id = run_with(stubs, unique("agent"), compaction=POLICY)
            long_run(stubs, run_id, turns, size=40)
            append(stubs, run_id, user("And now?"))
            append(stubs, run_id, compaction("Everything so far.", 1, 4 * turns))
            log = CountingLog(engine)
            history = HistoryReader(log)
            turn = history.read(run_id, turn=2, sequence=None, grep="", limit=8_000)
            after_turn = log.records
            page = history.read(run_id, turn=None, sequence=5, grep="", limit=600)
            after_page = log.records
            found = history.read(run_id, turn=2, sequence=None, grep="Question", limit=8_000)
            counted[turns] = (after_turn, after_page - after_turn, log.records - after_page)
            # The same pages but the handles, each Run's own.
            pages[turns] = tuple(re.sub(r"h_[0-9a-f]+", "h_…", p.text) for p in (turn, page))
            assert found.text == "#5 (turn 2): Question 2. " + "u" * 40
    finally:
        engine.dispose()
    assert pages[5] == pages[60]
    assert pages[5][0].startswith("[#5 · turn 2 · user]\nQuestion 2.")
    assert pages[5][0].endswith(f"[#8 · turn 2 · assistant]\nAnswer 2. {'a' * 40}")
    assert pages[5][1].startswith("[#5 · turn 2 · user]")
    # The same reads, the same records: nothing grows with the 55 more turns.
    assert counted[5] == counted[60]
    # A turn of four records: the compaction, the turn's bounds, its skeletons, their
    # contents and the result's shape, nothing else.
    assert counted[5][0] <= 1 + 2 + 4 + 3 + 1

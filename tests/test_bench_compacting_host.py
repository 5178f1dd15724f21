"""The long-run billing benchmark's comparison host (bench/cases/_long_run_hosts.py), on a
conversation built by hand (pure: no server): it compacts when a request reaches Anthropic's
default trigger and keeps only its summary, its summary call reads the cached prefix and is
billed under its own kind, results are capped, and the bill by kind adds up."""

from __future__ import annotations

import json

from bench.cases._long_run_hosts import (
    COMPACTING_TRIGGER_TOKENS,
    SUMMARY_PREFIX,
    CompactingHost,
    LongRunBill,
    long_run_kinds,
)
from bench.cases.billed_input import RESULT_CAP_TOKENS

SYSTEM = "# Instructions\n\nYou answer questions about the service's logs. " * 40


def play(host: CompactingHost, turns: int, result_chars: int) -> None:
    for number in range(1, turns + 1):
        host.user(f"Turn {number}. " + "what failed? " * 100)
        host.call()
        host.tool_step(f"t{number}", "log line\n" * (result_chars // 9))
        host.call()
        host.answer(f"Answer {number}. " + "the worker. " * 100)


def test_it_compacts_at_the_trigger_and_keeps_only_its_summary() -> None:
    host = CompactingHost(system=SYSTEM, summary_chars=6_000)
    play(host, 20, 60_000)  # about 16,000 tokens a turn: over 150,000 within ten turns
    assert host.compactions >= 1
    assert host.bill.summary_calls == host.compactions
    assert host.bill.max_request_tokens < COMPACTING_TRIGGER_TOKENS + 20_000
    # Every summary call read the prefix it shares with the call it stands for.
    summary_calls = [call for call in host.bill.per_call if call["tokens"] >= 150_000]
    assert summary_calls
    assert all(call["read"] > 0.8 * call["tokens"] for call in summary_calls)
    # The compacted span is gone: the conversation opens with the summary.
    first = host.conversation.messages[0]["content"][0]
    assert first["text"].startswith(SUMMARY_PREFIX)
    assert not any("Turn 1." in json.dumps(m) for m in host.conversation.messages)


def test_results_are_capped_and_the_bill_by_kind_adds_up() -> None:
    host = CompactingHost(system=SYSTEM)
    host.user("Turn 1. what failed?")
    host.call()
    host.tool_step("t1", "x" * (RESULT_CAP_TOKENS * 4 + 10_000))
    host.call()
    assert host.results_capped == 1
    body = host.conversation.body([], SYSTEM, host.calls, True)
    assert len(body) < (RESULT_CAP_TOKENS + 2_000) * 4
    kinds = long_run_kinds(body)
    assert kinds[0] == "tools"
    assert kinds[-1] == "trailing_block"
    assert {"system", "user", "tool_definitions_loaded", "current_turn_results"} <= set(kinds)
    # By kind counts the blocks' bytes: a call's closing brackets and its rounding up to a
    # whole token are left out, a few tokens a call.
    bill = host.bill
    slack = 4 * len(bill.per_call)
    assert abs(sum(bill.billed_by_kind.values()) - bill.billed) <= slack
    assert abs(sum(bill.input_by_kind.values()) - bill.input_tokens) <= slack


def test_a_summary_call_is_billed_under_its_own_kind() -> None:
    host = CompactingHost(system=SYSTEM)
    host.user("Turn 1. what failed?")
    body = host.conversation.body([], SYSTEM, 0, True)
    bill = LongRunBill()
    bill.request(body)
    before = dict(bill.billed_by_kind)
    bill.summary_call(body)
    assert bill.summary_calls == 1
    assert set(bill.billed_by_kind) == {*before, "summary_calls"}
    assert {k: v for k, v in bill.billed_by_kind.items() if k != "summary_calls"} == before
    assert abs(sum(bill.billed_by_kind.values()) - bill.billed) <= 4 * len(bill.per_call)

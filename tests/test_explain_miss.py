"""The cache-miss explainer and the usage pairing, on journal entries built by hand (pure
functions: no server needed)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TypedDict

from psych_sidecar.domain.prompt import (
    AssemblyEntry,
    ElidedResult,
    ElisionRule,
    SurfaceServer,
    Zone,
    ZoneSize,
)
from psych_sidecar.domain.run_inspector import MissCause, explain_miss, pair_usage
from psych_sidecar.domain.usage import ModelCallUsage, UsageEvent

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DOCS = SurfaceServer("docs", "connected", "deferred", 1, 12)


def entry(
    static: str = "s1",
    tail: str = "t1",
    history: str = "h1",
    *,
    servers: tuple[SurfaceServer, ...] = (DOCS,),
    elided: tuple[ElidedResult, ...] = (),
    spec_version: int = 1,
    guard: str | None = None,
    turn: int = 1,
    step: int = 0,
    last_sequence: int = 1,
    seconds: int = 0,
) -> AssemblyEntry:
    digests = {Zone.STATIC_SYSTEM: static, Zone.DYNAMIC_TAIL: tail, Zone.HISTORY: history}
    sizes = {Zone.STATIC_SYSTEM: 4000, Zone.DYNAMIC_TAIL: 400, Zone.HISTORY: 10_000}
    return AssemblyEntry(
        run_id="run_x",
        time=T0 + timedelta(seconds=seconds),
        model="m",
        spec_name="agent",
        spec_version=spec_version,
        turn=turn,
        step=step,
        last_sequence=last_sequence,
        zones=tuple(
            ZoneSize(z, sizes.get(z, 80), sizes.get(z, 80) // 4, digests.get(z, f"x{seconds}"))
            for z in Zone
        ),
        tool_count=4,
        servers=servers,
        elided=elided,
        context_guard=guard,
    )


def causes(before: AssemblyEntry | None, after: AssemblyEntry) -> list[MissCause] | None:
    miss = explain_miss(before, after)
    return None if miss is None else [reason.cause for reason in miss.reasons]


def test_a_first_call_and_a_history_that_only_grew_are_not_misses() -> None:
    assert explain_miss(None, entry()) is None
    assert explain_miss(entry(), entry(history="h2")) is None


def test_a_changed_tool_surface_names_what_changed_and_costs_zones_one_to_three() -> None:
    before = entry()
    gone = entry("s2", servers=(replace(DOCS, state="unreachable"),))
    miss = explain_miss(before, gone)
    assert miss is not None
    assert miss.first_zone is Zone.STATIC_SYSTEM
    assert [r.text for r in miss.reasons] == ["connection docs became unreachable"]
    assert miss.bytes_missed == 4000 + 400 + 10_000
    assert causes(before, entry("s2", servers=())) == [MissCause.CONNECTION_REMOVED]
    moved = entry("s2", servers=(replace(DOCS, catalog_version=2),))
    assert causes(before, moved) == [MissCause.CATALOG_VERSION]
    added = entry("s2", servers=(DOCS, SurfaceServer("crm", "connected", "direct", 3, 5)))
    assert causes(before, added) == [MissCause.CONNECTION_ADDED]
    assert causes(before, entry("s2", spec_version=2)) == [MissCause.SPEC_VERSION]
    assert causes(before, entry("s2")) == [MissCause.SURFACE]


def test_a_changed_tail_misses_from_zone_two() -> None:
    miss = explain_miss(entry(), entry(tail="t2"))
    assert miss is not None
    assert miss.first_zone is Zone.DYNAMIC_TAIL
    assert [r.cause for r in miss.reasons] == [MissCause.DYNAMIC_TAIL]
    assert miss.bytes_missed == 400 + 10_000
    assert miss.tokens_missed == 2600


def test_elision_at_a_turn_start_rewrites_the_history() -> None:
    elided = (ElidedResult(3, "h_a", ElisionRule.PER_RESULT),)
    miss = explain_miss(entry(), entry(history="h2", elided=elided, turn=2))
    assert miss is not None
    assert miss.first_zone is Zone.HISTORY
    assert [r.text for r in miss.reasons] == [
        "elision at the start of turn 2: #3 (per_result) elided"
    ]
    assert miss.bytes_missed == 10_000
    # The same elisions on the next step are no miss: views are stable within a turn.
    assert explain_miss(entry(elided=elided), entry(history="h3", elided=elided)) is None


def guarded(*sequences: int) -> tuple[ElidedResult, ...]:
    return tuple(ElidedResult(s, f"h_{s}", ElisionRule.CONTEXT_GUARD) for s in sequences)


class TurnAndHistory(TypedDict):
    """`entry` arguments several entries share."""

    turn: int
    history: str


def test_the_guard_is_judged_by_its_decisions_and_a_mid_turn_elision_is_named() -> None:
    step: TurnAndHistory = {"turn": 2, "history": "h2"}
    before = entry(**step, step=1, last_sequence=10, elided=guarded(5), guard="about 150000 tokens")
    # Its estimate moved and it elided a result newer than the previous call's log: the
    # previous call's bytes are all still there, so nothing to explain.
    grown = entry(
        **step, step=2, last_sequence=14, elided=guarded(5, 12), guard="about 160000 tokens"
    )
    assert explain_miss(before, grown) is None
    # A result the previous call sent in full, elided now: a mid-turn guard elision.
    rewrote = entry(**step, step=2, last_sequence=14, elided=guarded(5, 7), guard="about 9")
    miss = explain_miss(before, rewrote)
    assert miss is not None
    assert miss.first_zone is Zone.HISTORY
    assert [r.text for r in miss.reasons] == [
        "context guard mid-turn (turn 2, step 2): #7 elided after an earlier call of the "
        "turn sent it in full"
    ]
    # A result back in full is a miss too.
    restored = entry(**step, step=2, last_sequence=14, guard="about 9")
    assert causes(before, restored) == [MissCause.CONTEXT_GUARD]
    # At the next turn the guard's view becomes the thresholds' (the same bytes): no miss.
    next_turn = entry(
        turn=3, history="h2", elided=(ElidedResult(5, "h_5", ElisionRule.PER_RESULT),)
    )
    assert explain_miss(before, next_turn) is None


def usage_at(seconds: int) -> UsageEvent:
    return UsageEvent(
        f"u{seconds}", ModelCallUsage("m", 1, 1, 0, 0), T0 + timedelta(seconds=seconds)
    )


def test_usage_goes_to_the_call_it_follows_and_missing_usage_stays_missing() -> None:
    calls = [entry(seconds=0), entry(seconds=10), entry(seconds=20)]
    # Usage after calls 1 and 3 only; one event older than every call is ignored.
    events = [usage_at(-5), usage_at(1), usage_at(21)]
    assert pair_usage(calls, events) == [1, None, 2]
    assert pair_usage(calls, []) == [None, None, None]


def test_a_roster_change_in_zone_2_names_the_connection_and_a_flap_is_no_miss() -> None:
    # A deferred server connected: only the roster (zone 2) changed, not the tools.
    wiki = SurfaceServer("wiki", "connected", "deferred", 1, 40)
    added = entry(tail="t2", servers=(DOCS, wiki))
    miss = explain_miss(entry(), added)
    assert miss is not None
    assert miss.first_zone is Zone.DYNAMIC_TAIL
    assert [r.cause for r in miss.reasons] == [MissCause.CONNECTION_ADDED]
    # The host's tail alone.
    assert causes(entry(), entry(tail="t2")) == [MissCause.DYNAMIC_TAIL]
    # A server gone unreachable changes no cached zone (its state is in the transient
    # message): nothing to explain.
    flapped = entry(servers=(replace(DOCS, state="unreachable"),))
    assert explain_miss(entry(), flapped) is None


def test_a_compaction_is_named_and_its_results_are_not_called_restored() -> None:
    elided = (ElidedResult(3, "h_a", ElisionRule.PER_RESULT),)
    before = entry(elided=elided, turn=5, last_sequence=40)
    after = replace(entry("s1", "t1", "h9", turn=5, step=1, last_sequence=42), compacted_through=12)
    miss = explain_miss(before, after)
    assert miss is not None
    assert miss.first_zone is Zone.HISTORY
    assert [r.cause for r in miss.reasons] == [MissCause.COMPACTION]
    assert miss.reasons[0].text == "compaction: records 1 to #12 are now a summary"
    later = replace(after, compacted_through=30)
    assert explain_miss(after, later).reasons[0].text == (  # type: ignore[union-attr]
        "compaction: records up to #30 are now a summary (before: up to #12)"
    )
    assert explain_miss(after, replace(after, last_sequence=44)) is None

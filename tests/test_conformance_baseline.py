"""How scripts/test-conformance judges a run against its baseline: the committed baseline reads,
a failure not listed and a listed pass both fail the run, draft scenarios are not judged."""

from __future__ import annotations

from pathlib import Path

from tests.conformance.suite import BASELINE, Outcome, Scenario, judge, read_baseline

CORE = Scenario("initialize", frozenset({"2025-06-18", "2025-11-25"}))
AUTH = Scenario("auth/metadata-default", frozenset({"2025-11-25"}))
DRAFT = Scenario("auth/offline-access-scope", frozenset({"draft"}))
KNOWN = {CORE.name, AUTH.name, DRAFT.name}


def outcome(scenario: Scenario, passed: bool, tmp_path: Path) -> Outcome:
    return Outcome(scenario, passed, int(passed), int(not passed), 0, tmp_path)


def test_the_committed_baseline_gives_every_entry_a_reason() -> None:
    entries = read_baseline(BASELINE)
    # What the sidecar declines by design is listed; what it does, sign-in and a server's
    # questions (elicitation) included, is not.
    assert "auth/cross-app-access-complete-flow" in entries
    assert "elicitation-sep1034-client-defaults" not in entries
    assert all(len(reason) > 10 for reason in entries.values())
    assert "initialize" not in entries
    assert not [name for name in entries if name.startswith("auth/metadata-")]


def test_the_suites_of_a_scenario_follow_the_runners_grouping() -> None:
    assert CORE.suites == ["core"]
    assert AUTH.suites == ["core", "auth"]
    assert DRAFT.suites == ["draft"]
    assert Scenario(
        "auth/2025-03-26-oauth-endpoint-fallback", frozenset({"2025-03-26"})
    ).suites == ["backcompat"]
    assert Scenario("auth/client-credentials-jwt", frozenset({"extension"})).suites == [
        "extensions"
    ]


def test_expected_failures_and_passes_pass(tmp_path: Path) -> None:
    outcomes = [outcome(CORE, True, tmp_path), outcome(AUTH, False, tmp_path)]
    assert judge(outcomes, {AUTH.name: "no sign-in yet"}, KNOWN) == []


def test_a_failure_not_in_the_baseline_is_a_regression(tmp_path: Path) -> None:
    problems = judge([outcome(CORE, False, tmp_path)], {}, KNOWN)
    assert problems == ["regression: initialize failed and is not in the baseline"]


def test_a_baseline_entry_that_passes_is_stale(tmp_path: Path) -> None:
    problems = judge([outcome(AUTH, True, tmp_path)], {AUTH.name: "no sign-in yet"}, KNOWN)
    assert problems == ["stale baseline entry: auth/metadata-default passes now; remove it"]


def test_draft_scenarios_are_reported_not_judged(tmp_path: Path) -> None:
    assert judge([outcome(DRAFT, False, tmp_path)], {}, KNOWN) == []
    problems = judge([outcome(DRAFT, False, tmp_path)], {DRAFT.name: "x"}, KNOWN)
    assert problems == [
        "auth/offline-access-scope is reported, not judged: remove it from the baseline"
    ]


def test_an_entry_naming_no_scenario_of_the_suite_fails(tmp_path: Path) -> None:
    problems = judge([], {"auth/renamed": "gone"}, KNOWN)
    assert problems == ["the baseline names auth/renamed, which the installed suite does not have"]


def test_a_next_suite_scenario_is_judged_by_the_same_baseline_and_named_with_its_suite(
    tmp_path: Path,
) -> None:
    step_up = Scenario("auth/scope-step-up", frozenset({"2026-07-28"}), "", "0.2.0-alpha.12")
    assert step_up.label == "auth/scope-step-up [0.2.0-alpha.12]"
    known = KNOWN | {step_up.name}
    assert judge([outcome(step_up, False, tmp_path)], {step_up.name: "a reason"}, known) == []
    problems = judge([outcome(step_up, False, tmp_path)], {}, known)
    assert problems == [
        "regression: auth/scope-step-up [0.2.0-alpha.12] failed and is not in the baseline"
    ]

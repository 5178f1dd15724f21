"""How scripts/test-conformance reads the suite's requirement sets: a set's client leg, scored
and not scored (other legs left out), what it plays in which order and at which wire version,
and the per-set summary line. Against the installed suite's own sets when it is installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.suite import (
    OUTSIDE,
    ROOT,
    Outcome,
    RequirementSet,
    Scenario,
    read_requirement_set,
    requirement_sets,
    suite_scenarios,
    summary_line,
)

SET = """\
server:
  - server-initialize
client:
  - initialize
  - auth/metadata-default
not_scored:
  - scenario: auth/dpop
    leg: client
    reason: extension
  - scenario: json-schema-2020-12
    leg: server
    reason: pending
  - scenario: json-schema-2020-12-preservation
    leg: client
    reason: added-after-release
    note: >-
      the reference fixture
      cannot pass it yet
"""
INSTALLED = ROOT / ".tools/conformance/node_modules/@modelcontextprotocol/conformance"


def write_set(tmp_path: Path, text: str, revision: str = "2025-11-25") -> Path:
    path = tmp_path / f"{revision}.yaml"
    path.write_text(text)
    return path


def test_a_set_is_its_client_leg_scored_and_not_scored(tmp_path: Path) -> None:
    read = read_requirement_set(write_set(tmp_path, SET))
    assert read == RequirementSet(
        "2025-11-25",
        ("initialize", "auth/metadata-default"),
        (
            ("auth/dpop", "extension"),
            (
                "json-schema-2020-12-preservation",
                "added-after-release the reference fixture cannot pass it yet",
            ),
        ),
    )


def test_a_scenario_both_scored_and_not_scored_is_refused(tmp_path: Path) -> None:
    text = SET + "  - scenario: initialize\n    leg: client\n    reason: extension\n"
    with pytest.raises(ValueError, match="scored and not scored at once: initialize"):
        read_requirement_set(write_set(tmp_path, text))


def test_a_set_not_named_for_a_revision_or_malformed_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="named for a dated revision"):
        read_requirement_set(write_set(tmp_path, SET, revision="latest"))
    with pytest.raises(ValueError, match="not a list of scenario names"):
        read_requirement_set(write_set(tmp_path, "client: initialize\n"))
    with pytest.raises(ValueError, match="names no scenario"):
        read_requirement_set(write_set(tmp_path, "not_scored:\n  - leg: client\n"))


def test_each_set_plays_at_its_revision_then_what_no_set_names_but_extensions() -> None:
    older = RequirementSet(
        "2025-11-25", ("initialize", "tools_call"), (("auth/dpop", "extension"),)
    )
    newer = RequirementSet("2026-07-28", ("tools_call",), (("auth/dpop", "extension"),))
    listed = {
        "initialize": frozenset({"2025-06-18", "2025-11-25"}),
        "tools_call": frozenset({"2025-11-25", "2026-07-28"}),
        "auth/dpop": frozenset({"extension"}),
        "auth/2025-03-26-oauth-endpoint-fallback": frozenset({"2025-03-26"}),
        "sep-2640-client-no-prefetch": frozenset({"extension"}),
    }
    assert suite_scenarios([older, newer], listed) == [
        Scenario("initialize", "2025-11-25", True),
        Scenario("tools_call", "2025-11-25", True),
        Scenario("auth/dpop", "2025-11-25", False),
        Scenario("tools_call", "2026-07-28", True),
        Scenario("auth/dpop", "2026-07-28", False),
        Scenario("auth/2025-03-26-oauth-endpoint-fallback", OUTSIDE, False),
    ]


def test_a_set_naming_a_scenario_the_suite_lacks_stops_the_run() -> None:
    sets = [RequirementSet("2026-07-28", ("tools_call", "renamed"), ())]
    with pytest.raises(SystemExit, match="the suite lacks: renamed"):
        suite_scenarios(sets, {"tools_call": frozenset({"2026-07-28"})})


def test_the_summary_line_counts_scored_and_not_scored_apart(tmp_path: Path) -> None:
    def outcome(name: str, scored: bool, passed: bool) -> Outcome:
        return Outcome(
            Scenario(name, "2026-07-28", scored), passed, 3, int(not passed), 0, tmp_path
        )

    outcomes = [
        outcome("tools_call", True, True),
        outcome("request-metadata", True, True),
        outcome("auth/dpop", False, False),
    ]
    assert summary_line("2026-07-28", outcomes) == (
        "2026-07-28: scored 2/2 passed; not scored 0/1 passed; checks 9 passed, 1 failed, "
        "0 warnings"
    )


@pytest.mark.skipif(
    not INSTALLED.exists(), reason="the suite is not installed (scripts/test-conformance)"
)
def test_the_installed_suite_carries_both_revisions_sets() -> None:
    sets = {found.revision: found for found in requirement_sets(INSTALLED / "dist/index.js")}
    assert {"2025-11-25", "2026-07-28"} <= set(sets)
    assert "elicitation-sep1034-client-defaults" in sets["2025-11-25"].scored
    assert "sep-2322-client-request-state" in sets["2026-07-28"].scored
    assert "auth/dpop" in dict(sets["2026-07-28"].not_scored)

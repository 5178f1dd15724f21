"""Runs the MCP conformance suite's frozen client requirement sets against the sidecar, with
tests/conformance/host.py as the client under test.

    python -m tests.conformance.suite --node NODE --runner CONFORMANCE_JS --output DIR
        [--revision REVISION ...] [--scenario NAME ...] [--jobs N]

The installed suite carries one requirement set per spec revision, `requirements/REVISION.yaml`
beside its `dist/`: the set's `client` list is what conformance to that revision requires
(scored), its `not_scored` entries of the `client` leg are run and reported but never judged.
Every scenario of a set runs at that revision's wire version, as the runner's own
`--requirements REVISION` runs it (`--spec-version REVISION --force`), a few scenarios at a
time (`--jobs`; `--requirements` starts them all at once, which on a small machine makes the
sidecar's timing part of the verdict). The suite's client scenarios in neither set (but for
extension ones) run last, at their own version, reported, not judged. A scenario passes when
the runner's single-scenario verdict does: no failed or warning check, the host exited 0 and
did not time out. The run fails when a scored scenario fails. PSYCH_SIDECAR_ADDRESS (inherited
by the host) names the sidecar.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
# What the host may take per scenario: its own waits are bounded well below this.
SCENARIO_TIMEOUT_MS = 60_000
# Scenarios played at once. Each runs its own test server on its own port and the host its own
# connection; most of a scenario's time is waiting (processes starting, the sidecar's connection
# settling), so a few at once keep a busy 2-core machine's run short without making the
# sidecar's timing the verdict, as the runner's all-at-once `--requirements` would.
JOBS = 3
# The group of the suite's client scenarios that no requirement set lists.
OUTSIDE = "outside the sets"


@dataclass(frozen=True)
class RequirementSet:
    """One revision's client requirements: the scored scenarios, and the not-scored ones with
    the set's reason (and note, when it gives one)."""

    revision: str
    scored: tuple[str, ...]
    not_scored: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Scenario:
    name: str
    # The requirement set that lists it (OUTSIDE for none): the wire version it runs at.
    revision: str
    scored: bool

    @property
    def label(self) -> str:
        return f"{self.revision}: {self.name}"


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    passed: bool
    checks_passed: int
    checks_failed: int
    warnings: int
    result_dir: Path


def _names(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ValueError(f"{where} is not a list of scenario names")
    return list(value)


def read_requirement_set(path: Path) -> RequirementSet:
    """The client leg of a requirement set file (its name is the revision)."""
    revision = path.stem
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", revision):
        raise ValueError(f"{path}: a requirement set is named for a dated revision")
    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a mapping")
    scored = _names(document.get("client") or [], f"{path}: client")
    not_scored: list[tuple[str, str]] = []
    for entry in document.get("not_scored") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("scenario"), str):
            raise ValueError(f"{path}: a not_scored entry names no scenario: {entry!r}")
        if entry.get("leg") != "client":
            continue
        said = [str(entry[key]) for key in ("reason", "note") if entry.get(key)]
        reason = " ".join(" ".join(said).split())
        not_scored.append((entry["scenario"], reason))
    both = sorted(set(scored) & {name for name, _ in not_scored})
    if both:
        raise ValueError(f"{path}: scored and not scored at once: {', '.join(both)}")
    return RequirementSet(revision, tuple(scored), tuple(not_scored))


def requirement_sets(runner: Path) -> list[RequirementSet]:
    """Every requirement set the installed suite carries, oldest revision first: the
    `requirements/` directory of the package whose `dist/index.js` is the runner."""
    directory = runner.resolve().parent.parent / "requirements"
    found = sorted(directory.glob("*.yaml"))
    if not found:
        raise SystemExit(f"the installed suite has no requirement sets in {directory}")
    return [read_requirement_set(path) for path in found]


def suite_scenarios(
    sets: list[RequirementSet], listed: dict[str, frozenset[str]]
) -> list[Scenario]:
    """What a run plays: each set's scored then not-scored client scenarios, at its revision,
    then the suite's client scenarios (`listed`, with their spec versions) that no set names,
    but for extension ones: on no revision's timeline, the runner skips them outside a set."""
    scenarios: list[Scenario] = []
    for requirements in sets:
        scenarios += [Scenario(name, requirements.revision, True) for name in requirements.scored]
        scenarios += [
            Scenario(name, requirements.revision, False) for name, _ in requirements.not_scored
        ]
    named = {scenario.name for scenario in scenarios}
    unknown = sorted(named - set(listed))
    if unknown:
        raise SystemExit(
            f"the requirement sets name scenarios the suite lacks: {', '.join(unknown)}"
        )
    outside = [
        Scenario(name, OUTSIDE, False)
        for name, versions in listed.items()
        if name not in named and versions != {"extension"}
    ]
    return scenarios + outside


def listed_client_scenarios(node: str, runner: str) -> dict[str, frozenset[str]]:
    """The client scenarios of the installed suite and their spec versions (`extension` for
    one on no revision's timeline), from `conformance list`."""
    listing = subprocess.run(
        [node, runner, "list"], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    _, _, client_part = listing.partition("Client scenarios")
    client_part, _, _ = client_part.partition("Authorization server scenarios")
    return {
        found[1]: frozenset(found[2].split(","))
        for found in re.finditer(r"^\s*- (\S+) \[([^\]]*)\]$", client_part, re.MULTILINE)
    }


def run_scenario(node: str, runner: str, scenario: Scenario, output: Path) -> Outcome:
    folder = re.sub(r"[^A-Za-z0-9._-]", "_", scenario.revision)
    result_dir = output / folder / re.sub(r"[^A-Za-z0-9._-]", "_", scenario.name)
    result_dir.mkdir(parents=True)
    # The runner splits the command at spaces and runs it through a shell, appending the URL.
    host = f"{shlex.quote(sys.executable)} -m tests.conformance.host"
    command = [node, runner, "client", "--command", host, "--scenario", scenario.name]
    if scenario.revision != OUTSIDE:
        # The revision's wire version, whatever the scenario's own default.
        command += ["--spec-version", scenario.revision, "--force"]
    command += ["--timeout", str(SCENARIO_TIMEOUT_MS), "-o", str(result_dir)]
    with (result_dir / "runner.log").open("w") as log:
        status = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False
        ).returncode
    checks: list[dict[str, object]] = []
    for found in result_dir.glob("**/checks.json"):
        checks.extend(json.loads(found.read_text()))
    statuses = [check.get("status") for check in checks]
    return Outcome(
        scenario,
        status == 0,
        statuses.count("SUCCESS"),
        statuses.count("FAILURE"),
        statuses.count("WARNING"),
        result_dir,
    )


def _tally(outcomes: list[Outcome]) -> str:
    return f"{sum(outcome.passed for outcome in outcomes)}/{len(outcomes)} passed"


def summary_line(group: str, outcomes: list[Outcome]) -> str:
    """A set's line: scored passed/total, not scored passed/total, and the checks."""
    scored = [outcome for outcome in outcomes if outcome.scenario.scored]
    not_scored = [outcome for outcome in outcomes if not outcome.scenario.scored]
    checks_passed = sum(outcome.checks_passed for outcome in outcomes)
    checks_failed = sum(outcome.checks_failed for outcome in outcomes)
    warnings = sum(outcome.warnings for outcome in outcomes)
    parts = [f"scored {_tally(scored)}"] if scored else []
    parts.append(f"not scored {_tally(not_scored)}")
    return (
        f"{group}: {'; '.join(parts)}; checks {checks_passed} passed, {checks_failed} failed, "
        f"{warnings} warnings"
    )


def show_failure(outcome: Outcome) -> None:
    """The failed checks and the host's stderr, for a scored scenario that failed."""
    for found in outcome.result_dir.glob("**/checks.json"):
        for check in json.loads(found.read_text()):
            if check.get("status") in ("FAILURE", "WARNING"):
                detail = check.get("errorMessage") or check.get("description")
                print(f"      {check.get('status')} {check.get('name')}: {detail}")
    for stderr in outcome.result_dir.glob("**/stderr.txt"):
        for line in stderr.read_text().splitlines()[-20:]:
            print(f"      | {line}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True)
    parser.add_argument("--runner", required=True, help="the suite's dist/index.js")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--revision", action="append", help="run only these sets (repeatable)")
    parser.add_argument("--scenario", action="append", help="run only these (repeatable)")
    parser.add_argument("--jobs", type=int, default=JOBS, help="scenarios played at once")
    options = parser.parse_args()

    started = time.monotonic()
    sets = requirement_sets(Path(options.runner))
    if options.revision:
        unknown = sorted(set(options.revision) - {s.revision for s in sets})
        if unknown:
            raise SystemExit(f"unknown revisions: {', '.join(unknown)}")
        sets = [s for s in sets if s.revision in options.revision]
    scenarios = suite_scenarios(sets, listed_client_scenarios(options.node, options.runner))
    if options.revision:
        scenarios = [s for s in scenarios if s.revision != OUTSIDE]
    if options.scenario:
        unknown = sorted(set(options.scenario) - {s.name for s in scenarios})
        if unknown:
            raise SystemExit(f"unknown scenarios: {', '.join(unknown)}")
        scenarios = [s for s in scenarios if s.name in options.scenario]

    def play(scenario: Scenario) -> Outcome:
        return run_scenario(options.node, options.runner, scenario, options.output)

    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=options.jobs) as pool:
        # In the order of the sets, each printed once it and those before it have ended.
        for outcome in pool.map(play, scenarios):
            outcomes.append(outcome)
            scenario = outcome.scenario
            mark = "✓" if outcome.passed else ("✗" if scenario.scored else "~")
            note = "" if scenario.scored else " (not scored: reported, not judged)"
            print(
                f"{mark} {scenario.label}: {outcome.checks_passed} passed, "
                f"{outcome.checks_failed} failed, {outcome.warnings} warnings{note}",
                flush=True,
            )
            if not outcome.passed and scenario.scored:
                show_failure(outcome)

    print()
    for group in [s.revision for s in sets] + [OUTSIDE]:
        run = [outcome for outcome in outcomes if outcome.scenario.revision == group]
        if run:
            print(summary_line(group, run))
    failed = [o.scenario.label for o in outcomes if o.scenario.scored and not o.passed]
    print(f"\nrun time {time.monotonic() - started:.0f} s")
    for label in failed:
        print(f"FAILED: scored scenario {label}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

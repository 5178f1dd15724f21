"""Runs the MCP client conformance suite's scenarios one after another against the sidecar, with
tests/conformance/host.py as the client under test, and judges them against the baseline.

    python -m tests.conformance.suite --node NODE --runner CONFORMANCE_JS --output DIR
        [--next-runner CONFORMANCE_JS] [--baseline FILE] [--scenario NAME ...]

Every client scenario of the installed suite runs (the runner's own `--suite` runs them all at
once, which on a small machine makes the sidecar's timing part of the verdict). A scenario
passes when the runner's single-scenario verdict does: no failed or warning check, the host
exited 0 and did not time out. Draft-spec scenarios are reported, not judged; every other one
is judged against the baseline, as the runner's `--expected-failures` would judge it: a failure
not in the baseline is a regression, a baseline entry that passes is stale, and either fails the
run. PSYCH_SIDECAR_ADDRESS (inherited by the host) names the sidecar.

With `--next-runner`, the scenarios of `NEXT_SCENARIOS` also run from that (newer) suite, after
the pinned suite's, and are judged against the same baseline: a baseline entry names a
scenario whichever suite runs it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).with_name("baseline.txt")
# What the host may take per scenario: its own waits are bounded well below this.
SCENARIO_TIMEOUT_MS = 60_000
# Spec versions whose scenarios are reported, not judged.
REPORTED_ONLY = {"draft"}
# The scenarios run from the next suite (`--next-runner`) beside the pinned one: the scored
# auth scenarios of the 2026-07-28 revision that the pinned suite lacks or tests less, and its
# input-required round trips (docs/conformance.md).
NEXT_SCENARIOS = (
    "auth/iss-*",
    "auth/scope-step-up",
    "auth/authorization-server-migration",
    "sep-2322-client-request-state",
)
# And the HTTP header duties of 2026-07-28 (docs/mcp-2026-07-28.md).
NEXT_SCENARIOS += ("http-standard-headers", "http-custom-headers")


@dataclass(frozen=True)
class Scenario:
    name: str
    spec_versions: frozenset[str]
    # The runner that plays it, and its suite's version when not the pinned one.
    runner: str = ""
    next_version: str = ""

    @property
    def label(self) -> str:
        return f"{self.name} [{self.next_version}]" if self.next_version else self.name

    @property
    def suites(self) -> list[str]:
        """The runner's suites this scenario belongs to (its 0.1.x grouping, from spec versions:
        `core` holds every scenario of a dated spec revision since 2025-06-18, `auth` those of
        them under auth/, `backcompat` the 2025-03-26 ones)."""
        versions = self.spec_versions
        if versions == {"draft"}:
            return ["draft"]
        if versions == {"extension"}:
            return ["extensions"]
        if versions <= {"2025-03-26"}:
            return ["backcompat"]
        return ["core", "auth"] if self.name.startswith("auth/") else ["core"]

    @property
    def judged(self) -> bool:
        return not self.spec_versions <= REPORTED_ONLY


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    passed: bool
    checks_passed: int
    checks_failed: int
    warnings: int
    result_dir: Path


def client_scenarios(node: str, runner: str, next_version: str = "") -> list[Scenario]:
    """The client scenarios of the installed suite, from `conformance list`; of the next
    suite (`next_version` set), those of `NEXT_SCENARIOS`."""
    listing = subprocess.run(
        [node, runner, "list"], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    _, _, client_part = listing.partition("Client scenarios")
    client_part, _, _ = client_part.partition("Authorization server scenarios")
    found = [
        Scenario(match[1], frozenset(match[2].split(",")), runner, next_version)
        for match in re.finditer(r"^\s*- (\S+) \[([^\]]*)\]$", client_part, re.MULTILINE)
    ]
    if not next_version:
        return found
    return [s for s in found if any(fnmatch.fnmatch(s.name, p) for p in NEXT_SCENARIOS)]


def suite_version(node: str, runner: str) -> str:
    return subprocess.run(
        [node, runner, "--version"], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()


def read_baseline(path: Path) -> dict[str, str]:
    """Scenario name -> why it is expected to fail; `#` starts a comment line."""
    entries: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            raise SystemExit(f"{path}:{number}: {name} has no reason")
        entries[name] = reason.strip()
    return entries


def run_scenario(node: str, scenario: Scenario, output: Path) -> Outcome:
    if scenario.next_version:
        output = output / scenario.next_version
    result_dir = output / re.sub(r"[^A-Za-z0-9._-]", "_", scenario.name)
    result_dir.mkdir(parents=True)
    # The runner splits the command at spaces and runs it through a shell, appending the URL.
    host = f"{shlex.quote(sys.executable)} -m tests.conformance.host"
    with (result_dir / "runner.log").open("w") as log:
        status = subprocess.run(
            [
                node,
                scenario.runner,
                "client",
                "--command",
                host,
                "--scenario",
                scenario.name,
                "--timeout",
                str(SCENARIO_TIMEOUT_MS),
                "-o",
                str(result_dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            check=False,
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


def summary_line(suite: str, outcomes: list[Outcome]) -> str:
    passed = sum(outcome.passed for outcome in outcomes)
    checks_passed = sum(outcome.checks_passed for outcome in outcomes)
    checks_failed = sum(outcome.checks_failed for outcome in outcomes)
    warnings = sum(outcome.warnings for outcome in outcomes)
    return (
        f"{suite}: {passed} of {len(outcomes)} scenarios passed; checks {checks_passed} passed, "
        f"{checks_failed} failed, {warnings} warnings"
    )


def show_failure(outcome: Outcome) -> None:
    """The failed checks and the host's stderr, for a failure nobody expected."""
    for found in outcome.result_dir.glob("**/checks.json"):
        for check in json.loads(found.read_text()):
            if check.get("status") in ("FAILURE", "WARNING"):
                detail = check.get("errorMessage") or check.get("description")
                print(f"      {check.get('status')} {check.get('name')}: {detail}")
    for stderr in outcome.result_dir.glob("**/stderr.txt"):
        for line in stderr.read_text().splitlines()[-20:]:
            print(f"      | {line}")


def judge(outcomes: list[Outcome], baseline: dict[str, str], known: set[str]) -> list[str]:
    """What fails the run: regressions, stale entries, entries naming no judged scenario."""
    problems: list[str] = []
    for outcome in outcomes:
        name = outcome.scenario.name
        if not outcome.scenario.judged:
            if name in baseline:
                problems.append(f"{name} is reported, not judged: remove it from the baseline")
        elif not outcome.passed and name not in baseline:
            problems.append(
                f"regression: {outcome.scenario.label} failed and is not in the baseline"
            )
            show_failure(outcome)
        elif outcome.passed and name in baseline:
            problems.append(f"stale baseline entry: {outcome.scenario.label} passes now; remove it")
    problems.extend(
        f"the baseline names {name}, which the installed suite does not have"
        for name in sorted(set(baseline) - known)
    )
    return problems


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True)
    parser.add_argument("--runner", required=True, help="the suite's dist/index.js")
    parser.add_argument("--next-runner", help="the next suite's dist/index.js, for NEXT_SCENARIOS")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--scenario", action="append", help="run only these (repeatable)")
    options = parser.parse_args()

    started = time.monotonic()
    scenarios = client_scenarios(options.node, options.runner)
    if options.next_runner:
        version = suite_version(options.node, options.next_runner)
        scenarios += client_scenarios(options.node, options.next_runner, version)
    known = {scenario.name for scenario in scenarios}
    if options.scenario:
        unknown = sorted(set(options.scenario) - known)
        if unknown:
            raise SystemExit(f"unknown scenarios: {', '.join(unknown)}")
        scenarios = [scenario for scenario in scenarios if scenario.name in options.scenario]
    baseline = read_baseline(options.baseline)

    outcomes: list[Outcome] = []
    for scenario in scenarios:
        outcome = run_scenario(options.node, scenario, options.output)
        outcomes.append(outcome)
        mark = "✓" if outcome.passed else ("~" if scenario.name in baseline else "✗")
        note = "" if scenario.judged else " (draft: reported, not judged)"
        print(
            f"{mark} {scenario.label}: {outcome.checks_passed} passed, {outcome.checks_failed} "
            f"failed, {outcome.warnings} warnings{note}",
            flush=True,
        )

    print()
    suites: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        if outcome.scenario.next_version:
            suites.setdefault(outcome.scenario.next_version, []).append(outcome)
            continue
        for suite in outcome.scenario.suites:
            suites.setdefault(suite, []).append(outcome)
    for suite in ("core", "auth", "backcompat", "extensions", "draft"):
        if suite in suites:
            print(summary_line(suite, suites.pop(suite)))
    for suite, run in suites.items():
        print(summary_line(f"{suite} ({', '.join(NEXT_SCENARIOS)})", run))
    print(summary_line("all", outcomes))

    problems = judge(outcomes, baseline, known)
    expected = sum(not o.passed and o.scenario.name in baseline for o in outcomes)
    elapsed = time.monotonic() - started
    print(f"\nexpected failures (in the baseline): {expected}; run time {elapsed:.0f} s")
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""The contract suite's CI checks fail when they must: scripts/check-contract-coverage (every
RPC has a success and a failure scenario, or is listed as pending) and
scripts/check-contract-counts (every runner ran every scenario over both transports)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "tests" / "contract" / "scenarios"
PENDING = ROOT / "tests" / "contract" / "pending-rpcs.txt"


def _run(script: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, ROOT / "scripts" / script, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )


def _coverage(
    scenarios: Path = SCENARIOS, pending: Path = PENDING
) -> subprocess.CompletedProcess[str]:
    return _run("check-contract-coverage", "--scenarios", scenarios, "--pending", pending)


def _scenarios() -> dict[Path, dict[str, object]]:
    return {path: json.loads(path.read_text()) for path in sorted(SCENARIOS.glob("*.json"))}


def _covered_rpcs() -> list[str]:
    return sorted({str(scenario["rpc"]) for scenario in _scenarios().values()})


def _copy_scenarios(tmp_path: Path, keep: Callable[[dict[str, object]], bool]) -> Path:
    copy = tmp_path / "scenarios"
    copy.mkdir()
    for path, scenario in _scenarios().items():
        if keep(scenario):
            shutil.copy(path, copy / path.name)
    return copy


def _pending_entries() -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in PENDING.read_text().splitlines())
    return [line for line in lines if line]


def test_the_committed_scenarios_cover_every_rpc_not_pending() -> None:
    result = _coverage()
    assert result.returncode == 0, result.stdout + result.stderr
    for rpc in _pending_entries():
        assert f"{rpc} " in result.stdout
    assert "must shrink to empty" in result.stdout


def test_every_working_rpc_has_scenarios_and_is_not_pending() -> None:
    assert set(_covered_rpcs()) == {
        "SpecService.PublishSpec",
        "SpecService.GetSpec",
        "RunService.CreateRun",
        "RunService.GetRun",
        "RunService.AppendRecords",
        "RunService.ListRecords",
    }
    assert not set(_covered_rpcs()) & set(_pending_entries())


@pytest.mark.parametrize("rpc", _covered_rpcs())
def test_deleting_an_rpcs_scenarios_fails_the_check(rpc: str, tmp_path: Path) -> None:
    remaining = _copy_scenarios(tmp_path, lambda scenario: scenario["rpc"] != rpc)
    result = _coverage(remaining)
    assert result.returncode == 1
    assert f"{rpc}: no success and no failure scenario" in result.stderr


@pytest.mark.parametrize("rpc", _covered_rpcs())
def test_deleting_an_rpcs_failure_scenarios_fails_the_check(rpc: str, tmp_path: Path) -> None:
    def keep(scenario: dict[str, object]) -> bool:
        steps = scenario["steps"]
        assert isinstance(steps, list)
        return scenario["rpc"] != rpc or not any(
            step["call"] == rpc and "error" in step for step in steps
        )

    result = _coverage(_copy_scenarios(tmp_path, keep))
    assert result.returncode == 1
    assert f"{rpc}: no failure scenario" in result.stderr


def test_a_scenario_counts_only_for_its_own_rpc(tmp_path: Path) -> None:
    # Every scenario publishes a Spec on the way; only PublishSpec's own scenarios cover it.
    remaining = _copy_scenarios(tmp_path, lambda s: s["rpc"] != "SpecService.PublishSpec")
    assert any("SpecService.PublishSpec" in p.read_text() for p in remaining.glob("*.json"))
    result = _coverage(remaining)
    assert result.returncode == 1
    assert "SpecService.PublishSpec: no success and no failure scenario" in result.stderr


def test_a_pending_rpc_that_has_its_scenarios_is_a_stale_entry(tmp_path: Path) -> None:
    pending = tmp_path / "pending.txt"
    pending.write_text(PENDING.read_text() + "RunService.GetRun\n")
    result = _coverage(pending=pending)
    assert result.returncode == 1
    assert "RunService.GetRun: has both scenarios; delete it from pending.txt" in result.stderr


def test_an_rpc_neither_covered_nor_pending_fails_the_check(tmp_path: Path) -> None:
    pending = tmp_path / "pending.txt"
    pending.write_text("\n".join(e for e in _pending_entries() if e != "TurnService.ResolveTurn"))
    result = _coverage(pending=pending)
    assert result.returncode == 1
    assert "TurnService.ResolveTurn: no success and no failure scenario" in result.stderr


def test_the_pending_list_names_only_rpcs_of_the_contract(tmp_path: Path) -> None:
    pending = tmp_path / "pending.txt"
    pending.write_text(PENDING.read_text() + "TurnService.ResolveTurns\nTurnService.ResolveTurn\n")
    result = _coverage(pending=pending)
    assert result.returncode == 1
    assert "TurnService.ResolveTurns is not an RPC of the contract" in result.stderr
    assert "TurnService.ResolveTurn is listed twice" in result.stderr


def test_a_scenario_naming_what_the_contract_lacks_fails_the_check(tmp_path: Path) -> None:
    copy = _copy_scenarios(tmp_path, lambda scenario: True)
    path = copy / "RunService.GetRun.unknown-run.json"
    scenario = json.loads(path.read_text())
    scenario["steps"][0]["call"] = "RunService.GetRunz"
    scenario["steps"][0]["error"]["reason"] = "RUN_MISSING"
    scenario["steps"][0]["error"]["code"] = "NOTFOUND"
    path.write_text(json.dumps(scenario))
    result = _coverage(copy)
    assert result.returncode == 1
    assert "RunService.GetRunz is not an RPC of the contract" in result.stderr
    assert "no reason RUN_MISSING" in result.stderr
    assert "no status code NOTFOUND" in result.stderr


def _counts(tmp_path: Path, lines: list[str]) -> subprocess.CompletedProcess[str]:
    counts = tmp_path / "counts"
    counts.write_text("".join(f"{line}\n" for line in lines))
    return _run("check-contract-counts", counts)


def _all_counts(total: int) -> list[str]:
    return [f"{r} {t} {total}" for r in ("python", "go", "ts") for t in ("unix", "tcp")]


def test_equal_counts_of_every_scenario_pass(tmp_path: Path) -> None:
    result = _counts(tmp_path, _all_counts(len(_scenarios())))
    assert result.returncode == 0, result.stderr


def test_a_scenario_one_runner_skipped_fails_the_counts_check(tmp_path: Path) -> None:
    total = len(_scenarios())
    lines = _all_counts(total)
    lines[5] = f"ts tcp {total - 1}"
    result = _counts(tmp_path, lines)
    assert result.returncode == 1
    assert f"ts ran {total - 1} scenarios over tcp, not all {total}" in result.stderr


def test_a_runner_that_did_not_report_fails_the_counts_check(tmp_path: Path) -> None:
    lines = [line for line in _all_counts(len(_scenarios())) if not line.startswith("go ")]
    result = _counts(tmp_path, lines)
    assert result.returncode == 1
    assert "go reported no count over unix" in result.stderr
    assert "go reported no count over tcp" in result.stderr


def test_a_runner_reporting_twice_fails_the_counts_check(tmp_path: Path) -> None:
    total = len(_scenarios())
    result = _counts(tmp_path, [*_all_counts(total), f"python unix {total}"])
    assert result.returncode == 1
    assert "python reported unix twice" in result.stderr

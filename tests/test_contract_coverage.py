"""The contract suite's CI checks fail when they must: scripts/check-contract-coverage (every
RPC has a success and a failure scenario) and scripts/check-contract-counts (every runner ran
every scenario over both transports)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import psych.sidecar.v1

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "tests" / "contract" / "scenarios"


def _run(script: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, ROOT / "scripts" / script, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )


def _coverage(scenarios: Path = SCENARIOS) -> subprocess.CompletedProcess[str]:
    return _run("check-contract-coverage", "--scenarios", scenarios)


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


def _contract_rpcs() -> set[str]:
    """Every RPC of psych.sidecar.v1, from the generated descriptors (as the script reads them)."""
    package = psych.sidecar.v1
    modules = [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
        if info.name.endswith("_pb2")
    ]
    return {
        f"{service.name}.{method.name}"
        for module in modules
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_the_committed_scenarios_cover_every_rpc() -> None:
    result = _coverage()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MISSING" not in result.stdout


def test_every_rpc_of_the_contract_has_scenarios() -> None:
    # Read independently of the script, so a script that saw no RPCs cannot pass this.
    assert {"TurnService.ResolveTurn", "ToolService.ReadToolOutput"} < _contract_rpcs()
    assert set(_covered_rpcs()) == _contract_rpcs()


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

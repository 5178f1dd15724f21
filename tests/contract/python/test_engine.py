"""The Python engine against engine-cases.json, the rules every runner's engine must follow."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.contract.python.engine import (
    CONTRACT_DIR,
    MISSING,
    ScenarioError,
    capture,
    expand,
    mismatch,
)

CASES = json.loads((CONTRACT_DIR / "engine-cases.json").read_text(encoding="utf-8"))


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [case["name"] for case in cases]


@pytest.mark.parametrize("case", CASES["match"], ids=_ids(CASES["match"]))
def test_match(case: dict[str, Any]) -> None:
    try:
        problem = mismatch(
            expand(case["expected"], case.get("vars", {})), case.get("actual", MISSING)
        )
    except ScenarioError as error:
        problem = str(error)
    assert (problem is None) == case["ok"], problem


@pytest.mark.parametrize("case", CASES["expand"], ids=_ids(CASES["expand"]))
def test_expand(case: dict[str, Any]) -> None:
    if case.get("error"):
        with pytest.raises(ScenarioError):
            expand(case["template"], case.get("vars", {}))
    else:
        assert expand(case["template"], case.get("vars", {})) == case["result"]


@pytest.mark.parametrize("case", CASES["capture"], ids=_ids(CASES["capture"]))
def test_capture(case: dict[str, Any]) -> None:
    if case.get("error"):
        with pytest.raises(ScenarioError):
            capture(case["response"], case["path"])
    else:
        assert capture(case["response"], case["path"]) == case["value"]

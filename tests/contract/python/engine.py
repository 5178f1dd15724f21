"""The scenario engine of the Python runner: scenario shape, variables, `$repeat`, matching
and captures, exactly as tests/contract/README.md defines them (engine-cases.json pins the
rules, and the Go and TypeScript runners pass the same cases).

Nothing here speaks gRPC: the runner hands in a function that makes one call.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONTRACT_DIR = Path(__file__).resolve().parent.parent
SCENARIO_DIR = CONTRACT_DIR / "scenarios"
ERROR_DOMAIN = "psych.sidecar.v1"
CALL_TIMEOUT_SECONDS = 10.0
OAUTH_MCP_URL_ENV = "PSYCH_CONTRACT_OAUTH_MCP_URL"

_SCENARIO_KEYS = {"name", "rpc", "description", "steps"}
_STEP_KEYS = {"call", "request", "response", "error", "capture"}
_ERROR_KEYS = {"code", "reason", "metadata"}
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_INDEX = re.compile(r"[0-9]+")


class Missing:
    """An absent value in the actual JSON (proto3 JSON omits default values)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = Missing()


class ScenarioError(AssertionError):
    """A scenario does not hold, or cannot be run as written."""


@dataclass(frozen=True)
class ErrorDetail:
    """One detail of a failed call's google.rpc.Status: an ErrorInfo, or None for another type."""

    reason: str
    domain: str
    metadata: dict[str, str]


@dataclass(frozen=True)
class Outcome:
    """What one call answered: a response as proto3 JSON, or a status code name and details."""

    response: dict[str, Any] | None = None
    code: str = "OK"
    message: str = ""
    details: list[ErrorDetail | None] = field(default_factory=list)


Invoke = Callable[[str, dict[str, Any]], Outcome]


def runner_variables() -> dict[str, str]:
    """Variables scripts/test-contract defines for every runner: `oauth_mcp_url`, the OAuth
    test server it started (tests/contract/README.md, Variables)."""
    url = os.environ.get(OAUTH_MCP_URL_ENV)
    return {"oauth_mcp_url": url} if url else {}


def scenario_files() -> list[Path]:
    return sorted(SCENARIO_DIR.glob("*.json"))


def load_scenario(path: Path) -> dict[str, Any]:
    """Read one scenario and check its shape; a key this engine does not know fails it."""
    scenario = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(scenario, dict):
        raise ScenarioError(f"{path.name}: not a JSON object")
    _require_keys(scenario, _SCENARIO_KEYS, _SCENARIO_KEYS, path.name)
    _require(scenario["name"] == path.stem, f"{path.name}: name is not the file name")
    _require(isinstance(scenario["rpc"], str), f"{path.name}: rpc is not a string")
    _require(isinstance(scenario["description"], str), f"{path.name}: description")
    steps = scenario["steps"]
    _require(
        isinstance(steps, list) and bool(steps), f"{path.name}: steps must be a non-empty list"
    )
    for index, step in enumerate(steps):
        where = f"{path.name} step {index + 1}"
        _require(isinstance(step, dict), f"{where}: not an object")
        _require_keys(step, {"call", "request"}, _STEP_KEYS, where)
        _require(isinstance(step["call"], str), f"{where}: call is not a string")
        _require(isinstance(step["request"], dict), f"{where}: request is not an object")
        _require(
            ("response" in step) != ("error" in step), f"{where}: needs one of response, error"
        )
        if "response" in step:
            _require(isinstance(step["response"], dict), f"{where}: response is not an object")
        if "error" in step:
            error = step["error"]
            _require(isinstance(error, dict), f"{where}: error is not an object")
            _require_keys(error, {"code", "reason"}, _ERROR_KEYS, where)
            _require(isinstance(error["code"], str), f"{where}: error.code is not a string")
            _require(isinstance(error["reason"], str), f"{where}: error.reason is not a string")
            _require(
                isinstance(error.get("metadata", {}), dict), f"{where}: error.metadata not object"
            )
        if "capture" in step:
            _require("response" in step, f"{where}: capture needs a response")
            captures = step["capture"]
            _require(isinstance(captures, dict), f"{where}: capture is not an object")
            for name, capture_path in captures.items():
                _require(bool(_VARIABLE_NAME.fullmatch(name)), f"{where}: variable name {name!r}")
                _require(isinstance(capture_path, str), f"{where}: capture path of {name}")
    return scenario


def run_scenario(scenario: dict[str, Any], invoke: Invoke) -> None:
    """Run every step in order; raise ScenarioError at the first that does not hold."""
    variables = {"unique": secrets.token_hex(6), **runner_variables()}
    for index, step in enumerate(scenario["steps"]):
        where = f"step {index + 1} ({step['call']})"
        try:
            outcome = invoke(step["call"], expand(step["request"], variables))
            if "error" in step:
                _check_error(expand(step["error"], variables), outcome)
            else:
                response = _check_response(expand(step["response"], variables), outcome)
                for name, capture_path in step.get("capture", {}).items():
                    _require(name not in variables, f"variable {name} is already defined")
                    variables[name] = capture(response, capture_path)
        except ScenarioError as error:
            raise ScenarioError(f"{scenario['name']}: {where}: {error}") from None


def _check_response(expected: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """The response, when it matches `expected`."""
    if outcome.response is None:
        raise ScenarioError(
            f"expected a response, got {outcome.code}: {outcome.message} {outcome.details}"
        )
    problem = mismatch(expected, outcome.response)
    if problem:
        raise ScenarioError(f"{problem}; the response: {json.dumps(outcome.response)[:2000]}")
    return outcome.response


def _check_error(expected: dict[str, Any], outcome: Outcome) -> None:
    if outcome.response is not None:
        raise ScenarioError(
            f"expected {expected['code']} / {expected['reason']}, got a response "
            f"{json.dumps(outcome.response)[:2000]}"
        )
    got = f"{outcome.code} {outcome.message!r} with details {outcome.details}"
    if outcome.code != expected["code"]:
        raise ScenarioError(f"expected status {expected['code']}, got {got}")
    if len(outcome.details) != 1 or outcome.details[0] is None:
        raise ScenarioError(f"expected exactly one detail, an ErrorInfo; got {got}")
    info = outcome.details[0]
    if info.domain != ERROR_DOMAIN:
        raise ScenarioError(f"expected ErrorInfo domain {ERROR_DOMAIN}, got {got}")
    if info.reason != expected["reason"]:
        raise ScenarioError(f"expected reason {expected['reason']}, got {got}")
    problem = mismatch(expected.get("metadata", {}), info.metadata, "metadata")
    if problem:
        raise ScenarioError(f"{problem}; got {got}")


def substitute(text: str, variables: dict[str, str]) -> str:
    """Replace each ${name} by the variable's value; a malformed or unknown reference fails."""
    parts: list[str] = []
    position = 0
    while (start := text.find("${", position)) >= 0:
        reference = _REFERENCE.match(text, start)
        if reference is None:
            raise ScenarioError(f"malformed variable reference in {text[:200]!r}")
        name = reference.group(1)
        _require(name in variables, f"undefined variable ${{{name}}}")
        parts += [text[position:start], variables[name]]
        position = reference.end()
    parts.append(text[position:])
    return "".join(parts)


def expand(value: Any, variables: dict[str, str]) -> Any:
    """Variables in every string (not in keys), and each {"$repeat": [text, count]}."""
    if isinstance(value, str):
        return substitute(value, variables)
    if isinstance(value, list):
        return [expand(item, variables) for item in value]
    if isinstance(value, dict):
        if "$repeat" in value:
            return _repeat(value, variables)
        return {key: expand(item, variables) for key, item in value.items()}
    return value


def _repeat(value: dict[str, Any], variables: dict[str, str]) -> str:
    arguments = value["$repeat"]
    _require(
        len(value) == 1
        and isinstance(arguments, list)
        and len(arguments) == 2
        and isinstance(arguments[0], str)
        and _is_count(arguments[1]),
        f'$repeat takes ["text", count >= 0] and nothing beside it: {_show(value)}',
    )
    return substitute(arguments[0], variables) * int(arguments[1])


def mismatch(expected: Any, actual: Any, path: str = "") -> str | None:
    """Why `actual` does not match `expected`, or None when it does (README.md, Matching)."""
    where = path or "<response>"
    if isinstance(expected, dict) and any(key.startswith("$") for key in expected):
        return _matcher_mismatch(expected, actual, where)
    if actual is MISSING:
        return f"{where}: missing, expected {_show(expected)}"
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{where}: expected an object, got {_show(actual)}"
        for key, item in expected.items():
            problem = mismatch(item, actual.get(key, MISSING), f"{path}.{key}" if path else key)
            if problem:
                return problem
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{where}: expected a list of {len(expected)}, got {_show(actual)}"
        for index, (item, found) in enumerate(zip(expected, actual, strict=True)):
            problem = mismatch(item, found, f"{path}.{index}" if path else str(index))
            if problem:
                return problem
        return None
    if _same_literal(expected, actual):
        return None
    return f"{where}: expected {_show(expected)}, got {_show(actual)}"


def _same_literal(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or expected is None:
        return actual is expected
    if isinstance(expected, int | float):
        return (
            isinstance(actual, int | float)
            and not isinstance(actual, bool)
            and (actual == expected)
        )
    return isinstance(expected, str) and isinstance(actual, str) and actual == expected


def _matcher_mismatch(expected: dict[str, Any], actual: Any, where: str) -> str | None:
    if len(expected) != 1:
        return f"{where}: a matcher must be the only key of its object: {_show(expected)}"
    ((name, argument),) = expected.items()
    if name == "$present" and argument is True:
        return None if actual is not MISSING else f"{where}: missing, expected present"
    if name == "$absent" and argument is True:
        return None if actual is MISSING else f"{where}: expected absent, got {_show(actual)}"
    if name == "$len" and _is_count(argument):
        length = 0 if actual is MISSING else len(actual) if isinstance(actual, list) else None
        if length == argument:
            return None
        return f"{where}: expected a list of {argument}, got {_show(actual)}"
    return f"{where}: unknown matcher {_show(expected)}"


def capture(response: dict[str, Any], path: str) -> str:
    """The string at a dotted path of the response; a decimal segment indexes a list."""
    value: Any = response
    for segment in path.split("."):
        if isinstance(value, list) and _INDEX.fullmatch(segment) and int(segment) < len(value):
            value = value[int(segment)]
        elif isinstance(value, dict) and segment in value:
            value = value[segment]
        else:
            raise ScenarioError(f"capture {path!r}: nothing at {segment!r}")
    if not isinstance(value, str):
        raise ScenarioError(f"capture {path!r}: {_show(value)} is not a string")
    return value


def _show(value: Any) -> str:
    return "<missing>" if value is MISSING else json.dumps(value)[:200]


def _is_count(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and float(value).is_integer()
        and value >= 0
    )


def _require_keys(obj: dict[str, Any], required: set[str], allowed: set[str], where: str) -> None:
    unknown = set(obj) - allowed
    _require(not unknown, f"{where}: unknown keys {sorted(unknown)}")
    missing = required - set(obj)
    _require(not missing, f"{where}: missing keys {sorted(missing)}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ScenarioError(message)

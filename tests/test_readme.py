"""The README's snippets are the project's: each one is checked against what it claims."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from psych.sidecar.v1 import content_pb2, run_pb2
from psych_sidecar.config import load_settings
from tests.support.processes import served
from tests.support.prompts import valid_anthropic
from tests.support.sidecar import RunningSidecar

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
FIRST_CALLS = "### First calls from Python, Go or TypeScript, in your own project"
PYTHON = "#### Python"
GO = "#### Go"
TYPESCRIPT = "#### TypeScript"
# How the README names the reader's clone in its set-up commands.
CLONE = "/path/to/psych-sidecar"


def _blocks(language: str, heading: str) -> list[str]:
    """The fenced code blocks of one language in the section under `heading`."""
    blocks: list[str] = []
    inside = False
    fence: list[str] | None = None
    for line in README.splitlines(keepends=True):
        if fence is not None:
            if line.rstrip("\n") == "```":
                if inside and fence[0] == language:
                    blocks.append("".join(fence[1:]))
                fence = None
            else:
                fence.append(line)
        elif line.startswith("```"):
            fence = [line.strip().removeprefix("```")]
        elif line.startswith("#"):
            inside = line.rstrip("\n") == heading
    return blocks


def test_the_stdio_config_allows_a_node_and_a_python_server(tmp_path: Path) -> None:
    (config,) = _blocks("toml", "### Allowing a stdio MCP server")
    assert len(config.strip().splitlines()) == 3
    path = tmp_path / "my-sidecar.toml"
    path.write_text(config)
    settings = load_settings(str(path))
    assert settings.mcp.commands["everything"].argv[0] == "npx"
    assert settings.mcp.commands["time"].argv == [".venv/bin/mcp-server-time"]
    # The Node server at the version the tests connect to.
    pinned = re.search(
        r'"@modelcontextprotocol/server-everything": "([^"]+)"',
        (ROOT / "tests" / "mcp-peers" / "package.json").read_text(),
    )
    assert pinned is not None
    assert f"@modelcontextprotocol/server-everything@{pinned.group(1)}" in (
        settings.mcp.commands["everything"].argv
    )
    (command,) = _blocks("sh", "### Allowing a stdio MCP server")
    assert command.strip() == f"scripts/serve --config {path.name}"


def _region(path: str) -> str:
    text = (ROOT / path).read_text()
    return text.split("// README begin\n", 1)[1].split("// README end", 1)[0]


def test_the_go_and_typescript_snippets_are_the_files_ci_runs() -> None:
    """tests/go (TestReadmeSnippet) and tests/ts (readme.test.ts) build and run these files
    against a sidecar, and scripts/test-examples from scratch projects made by the README's
    set-up commands; the README must show them as they are."""
    assert _blocks("go", GO) == [_region("tests/go/readme/main.go")]
    assert _blocks("ts", TYPESCRIPT) == [_region("tests/ts/src/readme.ts")]


THINKING = "### A thinking model's loop, from the host's side"


def test_the_thinking_loops_in_go_and_typescript_are_the_files_ci_runs() -> None:
    """The clients' own tests build these files and run the loops against a sidecar with
    recorded responses (clients/go TestTheReadmesThinkingLoop, clients/ts client.test.ts)."""
    assert _blocks("go", THINKING) == [_region("clients/go/thinking_loop_test.go")]
    assert _blocks("ts", THINKING) == [_region("clients/ts/src/thinking_loop.test.ts")]


def test_the_go_set_up_replaces_the_generated_module_and_states_its_go_version() -> None:
    go_mod = (ROOT / "generated" / "go" / "go.mod").read_text()
    module = re.search(r"^module (\S+)$", go_mod, re.MULTILINE)
    go = re.search(r"^go (\d+\.\d+)", go_mod, re.MULTILINE)
    assert module is not None
    assert go is not None
    create, run = _blocks("sh", GO)
    assert "go mod init " in create
    assert f"go mod edit -replace {module.group(1)}={CLONE}/generated/go\n" in create
    assert run.splitlines() == ["go mod tidy", "go run ."]
    assert f"Needs Go {go.group(1)} or later" in README


def test_the_typescript_set_up_is_an_es_module_with_the_client_s_own_pins() -> None:
    """One @bufbuild/protobuf in the host's project: it installs the versions the client pins
    (scripts/test-examples also counts the copies npm installed)."""
    client = json.loads((ROOT / "clients" / "ts" / "package.json").read_text())
    create, run = _blocks("sh", TYPESCRIPT)
    assert "npm pkg set type=module" in create
    assert f"{CLONE}/clients/ts/psych-sidecar-client-{client['version']}.tgz" in create
    for name, version in {**client["dependencies"], **client["devDependencies"]}.items():
        assert f"{name}@{version}" in create
    assert run.splitlines()[-1] == "node main.js"
    node = re.fullmatch(r">=(\d+)", client["engines"]["node"])
    assert node is not None
    assert f"Needs Node.js {node.group(1)} or later" in README


def test_the_address_comes_from_the_environment_as_scripts_serve_prints_it() -> None:
    (export,) = _blocks("sh", FIRST_CALLS)
    assert export == f"export PSYCH_SIDECAR_ADDRESS=unix:{CLONE}/psych-sidecar-data/sidecar.sock\n"
    for path in ("tests/go/readme/main.go", "tests/ts/src/readme.ts"):
        assert "PSYCH_SIDECAR_ADDRESS" in _region(path)
    (python,) = _blocks("python", PYTHON)
    assert 'os.environ.get("PSYCH_SIDECAR_ADDRESS", "")' in python


def test_the_python_set_up_names_its_interpreter() -> None:
    """A plain python3 has no grpc: the README runs the snippet with the clone's .venv, and
    says how to install the stubs and the client into a host's own environment instead."""
    create, run = _blocks("sh", PYTHON)
    assert create == "mkdir my-host && cd my-host\n"
    assert run == f"{CLONE}/.venv/bin/python main.py\n"
    assert f"`pip install {CLONE}\n{CLONE}/clients/python`" in README


def _python_snippet(directory: Path, address: str) -> subprocess.CompletedProcess[str]:
    """The README's Python snippet, saved as main.py in `directory` (outside the clone) and run
    there with this interpreter (the clone's .venv in CI), as the README says."""
    (snippet,) = _blocks("python", PYTHON)
    (directory / "main.py").write_text(snippet)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PSYCH_SIDECAR_")}
    return subprocess.run(
        [sys.executable, "main.py"],
        cwd=directory,
        env={**environment, "PSYCH_SIDECAR_ADDRESS": address},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_python_snippet_runs_from_a_directory_outside_the_clone(tmp_path: Path) -> None:
    (tmp_path / "clone").mkdir()
    (tmp_path / "my-host").mkdir()
    socket_path = tmp_path / "clone" / "psych-sidecar-data" / "sidecar.sock"
    # scripts/serve's defaults, from the clone's root.
    with served(health=f"unix:{socket_path}", cwd=tmp_path / "clone"):
        outcome = _python_snippet(tmp_path / "my-host", f"unix:{socket_path}")
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout.splitlines() == [
        "appended at sequence 1",
        "NOT_FOUND RUN_NOT_FOUND run_missing",
    ]


def test_the_python_snippet_names_a_missing_socket_at_once(tmp_path: Path) -> None:
    """Before: a relative address tried from another directory, 10 s of waiting, then a
    FutureTimeoutError traceback that never named the address."""
    for address in ("unix:psych-sidecar-data/sidecar.sock", f"unix://{tmp_path / 'nobody.sock'}"):
        outcome = _python_snippet(tmp_path, address)
        socket_path = address.removeprefix("unix:").removeprefix("//")
        assert outcome.returncode == 1
        assert outcome.stderr == (
            f"no socket at {socket_path} (PSYCH_SIDECAR_ADDRESS={address}): "
            "is scripts/serve running?\n"
        )


if __name__ == "__main__":
    # scripts/test-examples: one block, `python -m tests.test_readme LANGUAGE HEADING INDEX`,
    # run from the root so that its test imports resolve.
    language, heading, index = sys.argv[1:]
    sys.stdout.write(_blocks(language, heading)[int(index)])


def test_the_thinking_loop_runs_against_a_sidecar_with_recorded_responses(
    grpc_server: RunningSidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thinking model's loop as the README shows it, run against a real sidecar; the
    provider's answers are two recorded Messages API responses, and the second request must
    carry the first response's thinking block as it came."""
    (snippet,) = _blocks("python", THINKING)
    monkeypatch.syspath_prepend(str(ROOT / "clients" / "python"))
    monkeypatch.setenv("PSYCH_SIDECAR_ADDRESS", grpc_server.sidecar.bound[0])
    thinking = {"type": "thinking", "thinking": "Look the order up.", "signature": "EqQBCgIY"}
    responses: list[dict[str, Any]] = [
        {
            "content": [
                thinking,
                {"type": "tool_use", "id": "toolu_1", "name": "find_order", "input": {"n": 7}},
            ]
        },
        {
            "content": [
                {"type": "thinking", "thinking": "Done.", "signature": "Ev4B"},
                {"type": "text", "text": "It ships tomorrow."},
            ]
        },
    ]
    sent: list[dict[str, Any]] = []

    def send_to_anthropic(body: bytes) -> dict[str, Any]:
        sent.append(valid_anthropic(body))
        return responses[len(sent) - 1]

    def run_host_tool(call: Any) -> run_pb2.Record:
        return run_pb2.Record(
            tool_result=run_pb2.ToolResult(
                call_id=call.call_id, content=[content_pb2.ContentPart(text="shipped")]
            )
        )

    host = types.ModuleType("my_host")
    host.send_to_anthropic = send_to_anthropic  # type: ignore[attr-defined]
    host.run_host_tool = run_host_tool  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_host", host)
    exec(compile(snippet, "README.md", "exec"), {})
    assert len(sent) == 2
    assert sent[0]["thinking"] == {"type": "enabled", "budget_tokens": 4000}
    assert sent[1]["messages"][1]["content"][0] == thinking

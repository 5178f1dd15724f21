"""scripts/test from where a newcomer stands: `--help`, every prerequisite checked before
anything starts (each one missing named, with where to get it), and a signal stops the running
step and all it started (scripts/stop-on-signal.bash)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

from tests.support.polling import wait_for

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "test"


def _path_without(tmp_path: Path, *programs: str) -> str:
    """A PATH with every program of this one but `programs`: one directory of links."""
    shadow = tmp_path / "bin"
    shadow.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = shadow / entry.name
            if entry.name in programs or link.exists() or link.is_symlink():
                continue
            if os.access(entry.path, os.X_OK) and not entry.is_dir():
                link.symlink_to(entry.path)
    return str(shadow)


def test_help_says_what_it_runs_and_needs() -> None:
    shown = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, check=True)
    assert shown.stdout.startswith("Installs what the tests need and runs all of them")
    for prerequisite in ("python3 (3.11+", "Go (1.26+)", "Node.js (20+) with npm", "git", "initdb"):
        assert prerequisite in shown.stdout
    assert "set -euo" not in shown.stdout


def test_a_missing_go_and_node_are_named_before_anything_starts(tmp_path: Path) -> None:
    outcome = subprocess.run(
        [SCRIPT],
        env={**os.environ, "PATH": _path_without(tmp_path, "go", "node")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Before: it installed .venv, started PostgreSQL and ran the whole Python suite, then
    # failed with "go: command not found".
    assert outcome.returncode == 1
    assert outcome.stdout == ""
    lines = outcome.stderr.splitlines()
    assert lines[0] == "scripts/test: missing prerequisites; nothing was started:"
    assert "  - go (1.26.0 or later): not on PATH" in lines
    assert "  - node (Node.js 20 or later): not on PATH" in lines
    assert any("https://go.dev/dl/" in line for line in lines)
    assert not any("python3" in line or "git" in line or "initdb" in line for line in lines)


def test_every_step_after_the_checks_runs_in_its_own_process_group() -> None:
    """Only a step run by `run` is stopped, whole, on a signal."""
    text = SCRIPT.read_text()
    steps = text.split(". scripts/stop-on-signal.bash\n", 1)[1]
    commands = [
        line.strip()
        for line in steps.splitlines()
        if line.strip()
        and not re.match(r"(#|step |status=|if |fi$|echo |exit |export |\[\[)", line.strip())
    ]
    assert commands
    for command in commands:
        assert command.startswith("run ") or " || run " in command, command


def _gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped counts: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def test_sigterm_stops_the_running_step_and_all_it_started(tmp_path: Path) -> None:
    # A step like scripts/with-postgres: it cleans up on SIGTERM, and has started a child
    # of its own (pytest, PostgreSQL's pg_ctl) that must not outlive it.
    step = (
        f"trap 'echo cleaned > {tmp_path}/cleaned; exit 143' TERM; "
        f"sleep 300 & echo $! > {tmp_path}/child; wait"
    )
    harness = (
        f". {ROOT}/scripts/stop-on-signal.bash\n"
        f"run bash -c {shlex.quote(step)}\n"
        f"echo 'after the step' > {tmp_path}/after\n"
    )
    script = subprocess.Popen(["bash", "-c", harness], stderr=subprocess.PIPE, text=True)
    child = tmp_path / "child"
    wait_for(lambda: child.exists() and child.read_text().strip(), "the step's child")
    script.send_signal(signal.SIGTERM)
    _, stderr = script.communicate(timeout=60)
    # Before (no trap): the script died alone; the step and its child ran on.
    assert script.returncode == 128 + signal.SIGTERM
    assert "SIGTERM: stopping the running step and what it started" in stderr
    # It waited for the step's own clean-up, and went no further.
    assert (tmp_path / "cleaned").read_text() == "cleaned\n"
    assert not (tmp_path / "after").exists()
    grandchild = int(child.read_text())
    wait_for(lambda: _gone(grandchild), "the step's child to exit")

"""Whether each allowed stdio command can start, checked when the sidecar starts: its program
is on PATH (or at its path), and each script its fixed arguments name (an argument ending in
.py, .js, ...) exists. A command that cannot start is named then, in one warning line, rather
than found at a host's first connection as "Connection closed".

Relative paths are the sidecar's working directory's, as for the process it would start. Only
standard-library calls: the check runs before the sidecar serves, and `scripts/serve` runs it
too (without loading the MCP SDK)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from psych_sidecar.config import StdioCommand

# An argument ending in one of these names a script the program runs.
SCRIPT_SUFFIXES = (".py", ".js", ".mjs", ".cjs", ".ts", ".mts", ".rb", ".pl", ".php", ".sh", ".jar")


def why_it_cannot_start(command: StdioCommand, cwd: Path | None = None) -> str | None:
    """What is missing for `command` to start, or None: its program, or a script it names."""
    base = cwd or Path.cwd()
    program = command.argv[0]
    if os.sep in program:
        path = base / program
        if not path.is_file():
            return f"its program {program} does not exist"
        if not os.access(path, os.X_OK):
            return f"its program {program} is not executable"
    else:
        search = command.env.get("PATH", os.environ.get("PATH", os.defpath))
        if shutil.which(program, path=search) is None:
            return f"its program {program} is not on PATH"
    for argument in command.argv[1:]:
        if argument.startswith("-") or not argument.endswith(SCRIPT_SUFFIXES):
            continue
        if not (base / argument).is_file():
            return f"its script {argument} does not exist"
    return None


def commands_that_cannot_start(
    commands: Mapping[str, StdioCommand], cwd: Path | None = None
) -> dict[str, str]:
    """Each allowed command that cannot start, by name, with what it misses."""
    problems = {name: why_it_cannot_start(command, cwd) for name, command in commands.items()}
    return {name: problem for name, problem in problems.items() if problem is not None}

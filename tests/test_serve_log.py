"""What `psych-sidecar serve` says in its log: a warning naming each allowed stdio command
that cannot start, and none of gRPC core's INFO lines ("Got goaway") while it serves; and
`scripts/serve` with another sidecar answering, which says so before it installs anything."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from psych_sidecar.config import StdioCommand
from psych_sidecar.mcp.command_check import commands_that_cannot_start
from tests.support.processes import served

ROOT = Path(__file__).parent.parent
FIXTURE_SERVER = ROOT / "tests" / "mcp_servers" / "fixture_server.py"


def test_each_allowed_command_that_cannot_start_is_named_at_start(tmp_path: Path) -> None:
    commands = {
        "fixture": {"argv": [sys.executable, str(FIXTURE_SERVER), "stdio"]},
        # scripts/install-mcp-peers not run: the npm package's script is not there.
        "everything": {
            "argv": ["node", "node_modules/@modelcontextprotocol/server-everything/dist/index.js"]
        },
        "no-program": {"argv": ["mcp-server-that-is-not-installed"]},
        "no-venv": {"argv": [".venv/bin/python", "server.py"]},
        # A package name is not a script: npx fetches it.
        "by-package": {"argv": ["npx", "-y", "@modelcontextprotocol/server-everything@2026.8.31"]},
    }
    with served(
        "--listen",
        f"unix://{tmp_path / 's.sock'}",
        "--data-dir",
        str(tmp_path),
        "--mcp-commands",
        json.dumps(commands),
        "--semantic-search",
        "off",
        cwd=tmp_path,
    ) as sidecar:
        warnings = [line for line in sidecar.log.splitlines() if "cannot start" in line]
    assert [line.split(" WARNING ", 1)[1] for line in warnings] == [
        "psych_sidecar.app.sidecar: the stdio MCP command everything cannot start: its script "
        "node_modules/@modelcontextprotocol/server-everything/dist/index.js does not exist",
        "psych_sidecar.app.sidecar: the stdio MCP command no-program cannot start: its program "
        "mcp-server-that-is-not-installed is not on PATH",
        "psych_sidecar.app.sidecar: the stdio MCP command no-venv cannot start: its program "
        ".venv/bin/python does not exist",
    ]


def test_a_script_is_found_relative_to_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "server.py").write_text("")
    command = StdioCommand(argv=[sys.executable, "server.py", "--port", "1"])
    assert commands_that_cannot_start({"here": command}, cwd=tmp_path) == {}
    assert commands_that_cannot_start({"elsewhere": command}, cwd=tmp_path / "sub") == {
        "elsewhere": "its script server.py does not exist"
    }


def _goaway_with_an_error_code(socket_path: Path) -> None:
    """An HTTP/2 client's preface, then GOAWAY with INTERNAL_ERROR (2), as Node's client sends
    when a host exits with its session open."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    goaway = b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + (0).to_bytes(4) + (2).to_bytes(4)
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(socket_path))
        client.sendall(preface + settings + goaway)
        # The server's own SETTINGS: it has read what came before, GOAWAY included.
        assert client.recv(9)[3] == 4


def test_a_client_s_goaway_leaves_no_grpc_core_line_in_the_log(tmp_path: Path) -> None:
    socket_path = tmp_path / "s.sock"
    with served(
        "--listen",
        f"unix://{socket_path}",
        "--data-dir",
        str(tmp_path),
        "--semantic-search",
        "off",
        env={"GRPC_VERBOSITY": None},
    ) as sidecar:
        _goaway_with_an_error_code(socket_path)
        _goaway_with_an_error_code(socket_path)
    # Before: "I1204 05:16:17.238822 28876 chttp2_transport.cc:1403] unix:: Got goaway [2] ..."
    assert "Got goaway" not in sidecar.log
    assert "chttp2_transport.cc" not in sidecar.log


def test_a_second_scripts_serve_says_another_serves_before_installing(tmp_path: Path) -> None:
    """scripts/serve uses the clone's .venv (scripts/test, and so CI, makes it)."""
    # Without it scripts/serve would make it: a first install, not this test's business.
    assert (ROOT / ".venv" / "bin" / "psych-sidecar").exists(), "no .venv: run scripts/test"
    listen = f"unix://{tmp_path / 's.sock'}"
    with served("--listen", listen, "--data-dir", str(tmp_path / "one")):
        second = subprocess.run(
            [ROOT / "scripts" / "serve", "--listen", listen, "--data-dir", str(tmp_path / "two")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    # Before: "[1/3] using the virtualenv .venv", "[2/3] installing psych-sidecar …" (pip, 8 s).
    assert second.returncode == 1
    assert "another sidecar is already serving on" in second.stderr
    assert "installing" not in second.stdout + second.stderr
    assert not (tmp_path / "two").exists()

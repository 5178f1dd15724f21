"""A stdio server's stderr (psych_sidecar/mcp/stderr.py): the rate limit's left-out lines are
counted in a WARNING when their window closes, whether or not another line arrives; a server
that dies as it starts has the line naming its error in the connection's last_error."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping

import pytest

from psych.sidecar.v1 import connection_pb2
from psych_sidecar.mcp.stderr import LOG_LINES_PER_INTERVAL, OPENING_LINE_CHARS, StderrTail
from tests.support.connections import put_stdio
from tests.support.polling import wait_for
from tests.support.sidecar import Stubs

# Servers that die as they start, each saying why on stderr in its own way.
SIDECAR_OVERRIDES = {
    "mcp_commands": {
        # Node's "Cannot find module" comes after a few lines of its loader's source.
        "node-without-its-script": {"argv": ["node", "/nonexistent/mcp-server/index.js", "stdio"]},
        # Python's error is the traceback's last line.
        "python-without-its-sdk": {
            "argv": [
                sys.executable,
                "-c",
                "import sys; print('starting', file=sys.stderr); import an_sdk_not_installed",
            ]
        },
        # A secret in the error, and a line longer than a last_error may quote.
        "quoting-its-token": {
            "argv": [
                sys.executable,
                "-c",
                "import os, sys; "
                "sys.exit('Error: refused ' + os.environ['APP_TOKEN'] + 'x' * 9000)",
            ],
            "allowed_env": ["APP_*"],
        },
    },
    "mcp_reconnect_min_seconds": 30,
    "semantic_search": "off",
}
# The attempt's failure is the same on every backend and transport.
SIDECAR_DATABASES = ["sqlite"]
SIDECAR_TRANSPORTS = ["unix"]

# Short enough that the tests wait fractions of a second for a window to close.
WINDOW_SECONDS = 0.2


# Other tests' sessions may log counts meanwhile (their windows close on timers too): only
# this label's count lines are the test's.
LABEL = "stderr-tail-test/flood"


def _window_timers() -> list[threading.Thread]:
    """The timers that would write this label's counts when their windows end."""
    name = f"mcp-stderr-window {LABEL}"
    return [thread for thread in threading.enumerate() if thread.name == name]


def _counts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith(f"MCP connection {LABEL}: ")
        and "not logged (rate limit)" in r.getMessage()
    ]


def test_a_flood_that_ends_inside_a_window_is_counted_when_the_window_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="psych_sidecar.mcp.stderr")
    tail = StderrTail(LABEL, lambda text: text, interval_seconds=WINDOW_SECONDS)
    tail.feed(b"a stderr line\n" * (LOG_LINES_PER_INTERVAL + 7))
    # No line follows: the count must come from the window closing.
    counts = wait_for(lambda: _counts(caplog), "the count of the lines left out")
    assert counts == [f"MCP connection {LABEL}: 7 stderr lines not logged (rate limit)"]
    logged = [r for r in caplog.records if "stderr: a stderr line" in r.getMessage()]
    assert len(logged) == LOG_LINES_PER_INTERVAL


def test_each_window_counts_its_own_lines_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="psych_sidecar.mcp.stderr")
    tail = StderrTail(LABEL, lambda text: text, interval_seconds=WINDOW_SECONDS)
    tail.feed(b"first\n" * (LOG_LINES_PER_INTERVAL + 3))
    wait_for(lambda: _counts(caplog), "the first window's count")
    tail.feed(b"second\n" * (LOG_LINES_PER_INTERVAL + 5))
    wait_for(lambda: len(_counts(caplog)) == 2, "the second window's count")
    # A window with nothing left out writes no count, and none is written twice: the quiet
    # window is closed by the next line (on this thread, before feed returns), and no timer is
    # left that could still write one.
    tail.feed(b"quiet\n")
    quiet_from = time.monotonic()
    wait_for(lambda: time.monotonic() - quiet_from >= WINDOW_SECONDS, "the quiet window's end")
    tail.feed(b"after\n")
    wait_for(lambda: not _window_timers(), "the windows' timers to end")
    assert [c.split(": ")[1] for c in _counts(caplog)] == [
        "3 stderr lines not logged (rate limit)",
        "5 stderr lines not logged (rate limit)",
    ]


def _last_error(
    stubs: Stubs, tenant: str, command: str, env: Mapping[str, str] | None = None
) -> str:
    connection = put_stdio(stubs, tenant, command, command, env=env)
    assert connection.state == connection_pb2.CONNECTION_STATE_UNREACHABLE
    return connection.last_error


def test_a_node_server_without_its_script_says_so_in_last_error(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    error = _last_error(stubs, unique("tenant"), "node-without-its-script")
    # Before: "MCP error -32000: Connection closed", the cause only in the sidecar's log.
    assert error.startswith(
        "MCP error -32000: Connection closed; stderr: Error: Cannot find module"
    )
    assert "/nonexistent/mcp-server/index.js" in error


def test_a_python_server_without_its_sdk_says_so_in_last_error(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    error = _last_error(stubs, unique("tenant"), "python-without-its-sdk")
    assert error.endswith(
        "; stderr: ModuleNotFoundError: No module named 'an_sdk_not_installed'"
    ), error


def test_the_quoted_stderr_line_is_scrubbed_and_bounded(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    token = "tok-" + unique("secret")
    error = _last_error(
        stubs,
        unique("tenant"),
        "quoting-its-token",
        env={"APP_TOKEN": token},
    )
    quoted = error.split("; stderr: ", 1)[1]
    assert quoted.startswith("Error: refused REDACTED")
    assert token not in error
    assert len(quoted) == OPENING_LINE_CHARS

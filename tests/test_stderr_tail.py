"""A stdio server's stderr rate limit (psych_sidecar/mcp/stderr.py): the lines it leaves out
are counted in a WARNING when their window closes, whether or not another line arrives."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from psych_sidecar.mcp.stderr import LOG_LINES_PER_INTERVAL, StderrTail
from tests.support.polling import wait_for

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

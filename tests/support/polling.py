"""The one way a test waits for something the sidecar does in the background."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# How long a test waits for something the sidecar does in the background (a reconnect, a
# refresh) before it fails. A correct sidecar gets there in well under a second.
SETTLE_SECONDS = 30.0


def wait_for(
    condition: Callable[[], T | None],
    what: str | Callable[[], str],
    *,
    within: float = SETTLE_SECONDS,
    every: float = 0.02,
) -> T:
    """Poll until `condition()` is truthy and return that value (never None, so a condition
    that answers None for "not yet" gives its value's type); fail after `within` seconds,
    saying what was awaited (`what`, or what it returns then, so the message can show the
    state last seen) and the last value. `condition` may itself raise to fail at once (a
    process that exited)."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(
                f"gave up after {within:g}s waiting for {described} (last: {value!r})"
            )
        time.sleep(every)

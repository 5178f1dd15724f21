"""Work tried first on the event loop's thread: a tool call's reads and its append take less
time on a SQLite database that need not wait than handing them to a worker thread and back
(a thread wake-up each way, on a small machine often a wait for a core). Anything on the way
that would wait for a lock or the network, or do work that grows with a catalogue, raises
`NotForTheEventLoop`, and the whole of it is done again on a worker thread (an attempt
changes nothing it does not undo: a write is rolled back)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class NotForTheEventLoop(Exception):
    """This work would wait or take long on the event loop's thread: do it on a worker."""


_attempt = threading.local()


@contextlib.contextmanager
def attempted_on_the_event_loop() -> Iterator[None]:
    """Marks this thread's work inside the block as an attempt on the event loop's thread."""
    _attempt.active = True
    try:
        yield
    finally:
        _attempt.active = False


def worker_thread_only(why: str) -> None:
    """Refuses the rest of an attempt on the event loop's thread: `why` names the work that
    is not for it (on a worker thread, or outside an attempt, this does nothing)."""
    if getattr(_attempt, "active", False):
        raise NotForTheEventLoop(why)

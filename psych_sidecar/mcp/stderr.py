"""A stdio server's stderr, bounded: the last few KiB in memory, rate-limited log lines.

An MCP server is untrusted and may write anything, as fast as it likes, to stderr. It used to
inherit the sidecar's own stderr (200 MB in 10 s reached the log). Now each process gets a pipe;
a reader thread keeps the tail in a ring buffer (shown as the connection's `recent_output`)
and logs at most a few lines per interval, counting the ones it drops. The count is written
when the interval ends, by a timer: a flood that stops inside one interval is counted too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

log = logging.getLogger(__name__)

TAIL_BYTES = 4096
# At most this many lines per interval reach the log, each cut to LINE_CHARS characters.
LOG_LINES_PER_INTERVAL = 20
LOG_INTERVAL_SECONDS = 10.0
LINE_CHARS = 500
_READ_BYTES = 65536


class StderrTail:
    """The tail of one connection's stderr, across its processes. Thread-safe."""

    def __init__(
        self,
        label: str,
        scrub: Callable[[str], str],
        interval_seconds: float = LOG_INTERVAL_SECONDS,
    ) -> None:
        self._label = label
        self._scrub = scrub
        self._interval = interval_seconds
        self._lock = threading.Lock()
        self._tail = bytearray()
        # Bytes fed so far, and the text of the tail as of that count.
        self._fed = 0
        self._text: tuple[int, str] | None = None
        self._partial = bytearray()
        # The rate limit's window; its own lock, as the timer closing it is another thread.
        self._window_lock = threading.Lock()
        self._window_start = time.monotonic()
        self._logged = 0
        self._dropped = 0

    def text(self) -> str:
        """The tail, scrubbed; computed once per change (every turn's status reads it)."""
        with self._lock:
            fed, cached = self._fed, self._text
            if cached is not None and cached[0] == fed:
                return cached[1]
            tail = bytes(self._tail)
        cut = tail.find(b"\n")
        if len(tail) >= TAIL_BYTES and 0 <= cut < len(tail) - 1:
            tail = tail[cut + 1 :]  # start at a line, not mid-way
        text = self._scrub(tail.decode(errors="replace"))
        with self._lock:
            self._text = (fed, text)
        return text

    def feed(self, data: bytes) -> None:
        with self._lock:
            self._fed += len(data)
            self._tail += data
            del self._tail[:-TAIL_BYTES]
            self._partial += data
            lines = self._partial.split(b"\n")
            self._partial = bytearray(lines.pop()[-LINE_CHARS * 4 :])
        for line in lines:
            self._log(line)

    def _log(self, line: bytes | bytearray) -> None:
        with self._window_lock:
            now = time.monotonic()
            if now - self._window_start >= self._interval:
                self._close_window(now)
            if self._logged >= LOG_LINES_PER_INTERVAL:
                self._dropped += 1
                if self._dropped == 1:
                    self._count_at_window_end(self._window_start, now)
                return
            self._logged += 1
        text = self._scrub(line[: LINE_CHARS * 4].decode(errors="replace"))[:LINE_CHARS]
        log.info("MCP connection %s stderr: %s", self._label, text.rstrip())

    def _close_window(self, now: float) -> None:
        """Write the count of the lines the window left out, and open the next one."""
        if self._dropped:
            log.warning(
                "MCP connection %s: %d stderr lines not logged (rate limit)",
                self._label,
                self._dropped,
            )
        self._window_start, self._logged, self._dropped = now, 0, 0

    def _count_at_window_end(self, window_start: float, now: float) -> None:
        """Close the window when it ends, unless a later line has closed it already: the
        count must not wait for a line that may never come."""

        def close() -> None:
            with self._window_lock:
                if self._window_start == window_start:
                    self._close_window(time.monotonic())

        timer = threading.Timer(window_start + self._interval - now, close)
        timer.name = f"mcp-stderr-window {self._label}"
        timer.daemon = True
        timer.start()

    @contextlib.contextmanager
    def pipe(self) -> Iterator[TextIO]:
        """A writable file to give a child process as its stderr. A reader thread feeds what
        arrives into this tail; it ends by itself at EOF, which comes once this file is closed
        (on the way out) and the child, and anything it started, has exited. It is not joined:
        a grandchild holding the pipe open must not hold up the session's end."""
        read_fd, write_fd = os.pipe()
        writer = os.fdopen(write_fd, "w")
        try:
            threading.Thread(
                target=self._read, args=(read_fd,), name=f"mcp-stderr {self._label}", daemon=True
            ).start()
        except BaseException:
            os.close(read_fd)
            writer.close()
            raise
        try:
            yield writer
        finally:
            writer.close()

    def _read(self, fd: int) -> None:
        try:
            while chunk := os.read(fd, _READ_BYTES):
                self.feed(chunk)
        except OSError:
            pass
        finally:
            os.close(fd)

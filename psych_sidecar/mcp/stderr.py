"""A stdio server's stderr, bounded: the last few KiB in memory, rate-limited log lines.

An MCP server is untrusted and may write anything, as fast as it likes, to stderr. It used to
inherit the sidecar's own stderr (200 MB in 10 s reached the log). Now each process gets a pipe;
a reader thread keeps the tail in a ring buffer (shown as the connection's `recent_output`)
and logs at most a few lines per interval, counting the ones it drops. The count is written
when the interval ends, by a timer: a flood that stops inside one interval is counted too.

A server that dies as it starts usually says why on stderr ("Error: Cannot find module …",
"ModuleNotFoundError: …"), while the MCP client sees only "Connection closed". Each process's
first few KiB are kept apart, so the failed attempt's `last_error` can quote the line that
names the error (`opening_line`): scrubbed and cut like a logged line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

import anyio

log = logging.getLogger(__name__)

TAIL_BYTES = 4096
# At most this many lines per interval reach the log, each cut to LINE_CHARS characters.
LOG_LINES_PER_INTERVAL = 20
LOG_INTERVAL_SECONDS = 10.0
LINE_CHARS = 500
_READ_BYTES = 65536
# A process's opening output kept to find the line naming its error, and that line's length
# in a connection's last_error.
OPENING_BYTES = 8192
OPENING_LINE_CHARS = 300
# A line naming an error: "Error: …", "ModuleNotFoundError: …", "error: …", "FATAL …".
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]*(?:Error|Exception)\b|error\b|fatal\b)", re.IGNORECASE)


class _Opening:
    """The first OPENING_BYTES one process wrote to stderr, and whether its stderr ended."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.ended = threading.Event()

    def feed(self, data: bytes) -> None:
        if len(self.data) < OPENING_BYTES:
            self.data += data[: OPENING_BYTES - len(self.data)]

    def line(self) -> str:
        """The first line naming an error, else the first line that is not blank."""
        data = bytes(self.data)  # the reader may still be adding to it (a child holds the pipe)
        text = data.decode(errors="replace")
        head, _, cut = text.rpartition("\n")
        if len(data) >= OPENING_BYTES and len(cut) < OPENING_BYTES // 2:
            # A line cut at the limit could end in part of a secret the scrubber would miss;
            # one that ran for half the limit is quoted far from the cut.
            text = head
        lines = [line.strip() for line in text.splitlines()]
        lines = [line for line in lines if line]
        for line in lines:
            if _ERROR_LINE.match(line):
                return line
        return lines[0] if lines else ""


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
        # The current process's opening output; None before a process, or after `forget`.
        self._opening: _Opening | None = None

    def forget_opening(self) -> None:
        """A new attempt starts: the last process's opening lines are no longer its news."""
        self._opening = None

    async def opening_line(self, within: float) -> str:
        """The line of the current process's stderr that names its error (else its first
        line), scrubbed and cut to OPENING_LINE_CHARS; "" when it wrote nothing. Waits up to
        `within` seconds for its stderr to end, so a process that just died has said it all."""
        opening = self._opening
        if opening is None:
            return ""
        if not opening.ended.is_set():
            await anyio.to_thread.run_sync(opening.ended.wait, within)
        return self._scrub(opening.line())[:OPENING_LINE_CHARS]

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
        opening = self._opening = _Opening()
        try:
            threading.Thread(
                target=self._read,
                args=(read_fd, opening),
                name=f"mcp-stderr {self._label}",
                daemon=True,
            ).start()
        except BaseException:
            os.close(read_fd)
            writer.close()
            raise
        try:
            yield writer
        finally:
            writer.close()

    def _read(self, fd: int, opening: _Opening) -> None:
        try:
            while chunk := os.read(fd, _READ_BYTES):
                opening.feed(chunk)
                self.feed(chunk)
        except OSError:
            pass
        finally:
            os.close(fd)
            opening.ended.set()

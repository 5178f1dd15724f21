"""A stdio peer that writes scripted bytes to stdout, for the stdio transport's reader tests
(tests/test_stdio_reader.py): what a real MCP server's stdout may look like, written in the
pieces a test needs.

    python tests/mcp_servers/stdout_server.py MODE

Modes:
- `split`: one large JSON-RPC notification, written in many small pieces (with pauses, so
  the reader receives it in many chunks), then waits for stdin to close;
- `many`: several notifications in one write, then waits;
- `endless`: a line that never ends (64 KiB pieces until the pipe closes);
- `garbage`: lines that are not JSON-RPC (not JSON, half JSON, invalid UTF-8), then a
  notification, then waits;
- `eof_mid_line`: a notification, then half of another, then exits.
"""

from __future__ import annotations

import json
import os
import sys
import time

# Larger than the transport's inline-parse size, so it is parsed on a worker thread.
SPLIT_TEXT_BYTES = 3 * 1024 * 1024


def notification(index: int, text: str = "") -> bytes:
    message = {
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {"level": "info", "data": {"index": index, "text": text}},
    }
    return json.dumps(message).encode() + b"\n"


def wait_for_stdin_to_close() -> None:
    while os.read(0, 65536):
        pass


def main(mode: str) -> None:
    if mode == "split":
        line = notification(0, "é" * (SPLIT_TEXT_BYTES // 2))
        piece = 4096
        for index, start in enumerate(range(0, len(line), piece)):
            os.write(1, line[start : start + piece])
            if index % 64 == 0:
                time.sleep(0.002)  # let the reader take what is there: many chunks
        wait_for_stdin_to_close()
    elif mode == "many":
        os.write(1, b"".join(notification(index) for index in range(5)))
        wait_for_stdin_to_close()
    elif mode == "endless":
        filler = b"x" * 65536
        try:
            while True:
                os.write(1, filler)
        except BrokenPipeError:
            return
    elif mode == "garbage":
        os.write(1, b'this is not JSON-RPC\n{"half": \n\x00\xff\n')
        os.write(1, notification(7))
        wait_for_stdin_to_close()
    elif mode == "eof_mid_line":
        line = notification(1)
        os.write(1, line + line[: len(line) // 2])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1])

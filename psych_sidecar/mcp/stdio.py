"""The stdio transport: the SDK's `stdio_client` with a reader that stays linear and bounded.

The SDK's reader decodes each chunk the pipe gives and re-splits `buffer + chunk` at every
read, then validates each line on the event loop: one 50 MB tool result (one line) costs
quadratic copying and a JSON parse of 50 MB between two health checks. This reader keeps the
SDK's process handling as it is (the same spawn in its own process group, inherited
environment, stderr pipe, shutdown sequence: close stdin, wait, kill the group), by calling the
SDK's own helpers, and replaces the read side only:

- it works on bytes and looks for the newline in each new chunk only, keeping a line's chunks
  in a list that is joined once, when the line ends;
- a line is bounded (the `mcp_stdio_max_line_bytes` setting, 256 MiB): an MCP server is
  untrusted, and a line without end must not take the sidecar's memory. A longer line ends
  the connection (its pending calls fail with CONNECTION_CLOSED, the session reconnects)
  after a transport error naming the limit;
- a large line is parsed and validated on a worker thread, small ones inline (a thread hop
  costs more than parsing a few KiB), after a block its size is left in malloc's keeping with
  its pages in memory (`heap.leave_touched_block`), for the parse's strings; once parsed,
  the free memory malloc kept goes back (`heap.release_kept_memory`);
- a line that is not JSON-RPC is what the SDK makes of it: the validation error is delivered
  to the session (which logs it) and the reading goes on.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio
import anyio.lowlevel
import anyio.to_thread
import mcp_types as types
import pydantic_core
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import (
    StdioServerParameters,
    _aclose_all,
    _create_platform_compatible_process,
    _drain_stdout,
    _get_executable_command,
    _stop_server_process,
    get_default_environment,
)
from mcp.shared.message import SessionMessage

from psych_sidecar.bulk import heap

log = logging.getLogger(__name__)

# Lines up to this size are parsed on the event loop; longer ones on a worker thread.
INLINE_PARSE_BYTES = 64 * 1024
# A response from a line longer than this is emptied once its call is done with it
# (`release_large_result`).
RELEASED_LINE_BYTES = 1024 * 1024
# How much one read from the pipe may return.
_READ_BYTES = 1024 * 1024
# As in the SDK: time for the writer to flush accepted messages before stdin closes.
_WRITER_FLUSH_TIMEOUT = 0.5

Item = SessionMessage | Exception

# The results of large responses read lately, for `release_large_result`: the SDK's read loop
# keeps the last message it dispatched until the next one arrives, and with it a result of
# tens of MB that the call has long converted. A few at most: an entry the session never
# releases (its call timed out) only waits here to be pushed out.
_large_results: deque[dict[str, Any]] = deque(maxlen=8)
_large_results_lock = threading.Lock()


class LineTooLong(ValueError):
    """A stdio server wrote a line longer than the sidecar reads."""


def parse_line(line: bytes) -> Item:
    """One stdout line as the SDK reads it: a message, or the error for the session to see."""
    try:
        # Parsing to Python values, then validating them, is four times quicker than the
        # adapter's validate_json on a line of tens of MB (jiter either way, the same rules:
        # JSON values validate alike from Python), and holds the GIL that much less.
        message = types.jsonrpc_message_adapter.validate_python(
            pydantic_core.from_json(line), by_name=False
        )
    except ValueError as error:
        # The SDK logs every such line with a stack; a server printing its banner to stdout
        # is common enough that the line's error, delivered to the session, is enough.
        return error
    return SessionMessage(message)


def _parse_pieces(pieces: list[bytes]) -> Item:
    # A bytes join of megabytes releases the GIL while it copies.
    line = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    # The chunks go as soon as they are joined, not with the parse: one copy of the line less
    # at the peak.
    pieces.clear()
    # The parse holds the GIL throughout: its strings go into pages already in memory.
    touched = heap.leave_touched_block(line)
    item = parse_line(line)
    large = len(line) > RELEASED_LINE_BYTES
    del line
    if touched:
        # The line and its chunks are free now; kept, their blocks did not fit the result's
        # next copies (its text's bytes, its JSON), each a little larger, and the private
        # memory grew by their size with every large result.
        heap.release_kept_memory()
    if (
        large
        and isinstance(item, SessionMessage)
        and isinstance(item.message, types.JSONRPCResponse)
    ):
        with _large_results_lock:
            _large_results.append(item.message.result)
    return item


def release_large_result(result: types.CallToolResult) -> None:
    """Empty the response `result` was validated from, if it was a large one read here: the
    call has made its own copies (the log's parts, its JSON) and `result` is its last use, but
    the SDK's read loop would keep the texts alive until the server's next message — another
    result's size while the next large result lands. Found by identity (the validated result
    holds the response's very strings), so no other response is touched."""
    texts = {id(block.text) for block in result.content if isinstance(block, types.TextContent)}
    if not texts:
        return
    with _large_results_lock:
        for raw in list(_large_results):
            content = raw.get("content")
            if isinstance(content, list) and any(
                isinstance(block, dict) and id(block.get("text")) in texts for block in content
            ):
                raw.clear()
                _large_results.remove(raw)


async def _parse(pieces: list[bytes], size: int) -> Item:
    if size <= INLINE_PARSE_BYTES:
        return _parse_pieces(pieces)
    return await anyio.to_thread.run_sync(_parse_pieces, pieces)


async def read_lines(
    receive: AsyncIterator[bytes], max_line_bytes: int
) -> AsyncIterator[tuple[list[bytes], int] | LineTooLong]:
    """The lines in a byte stream, each as its pieces (to join) and size, without its
    newline; the newline is looked for in each chunk once, so a line of many chunks costs
    no more than its length. A line longer than `max_line_bytes` ends the stream with a
    LineTooLong; a last line without its newline (the stream ended mid-line) is dropped, as
    the SDK does."""
    pending: list[bytes] = []
    pending_bytes = 0
    async for chunk in receive:
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            size = pending_bytes + end - start
            if size > max_line_bytes:
                yield LineTooLong(_too_long(size, max_line_bytes))
                return
            pending.append(chunk[start:end])
            yield pending, size
            pending = []
            pending_bytes = 0
            start = end + 1
        if start < len(chunk):
            pending_bytes += len(chunk) - start
            if pending_bytes > max_line_bytes:
                yield LineTooLong(_too_long(pending_bytes, max_line_bytes))
                return
            pending.append(chunk[start:] if start else chunk)


def _too_long(size: int, limit: int) -> str:
    return (
        f"the MCP server wrote a line of more than {limit} bytes (at least {size}); "
        "the connection is closed"
    )


@asynccontextmanager
async def stdio_transport(
    server: StdioServerParameters, errlog: TextIO, max_line_bytes: int
) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Item], MemoryObjectSendStream[SessionMessage]]]:
    """The SDK's `stdio_client` (mcp/client/stdio.py) with the reader above; lines up to
    `max_line_bytes`."""
    command = await _get_executable_command(server.command)
    process = await _create_platform_compatible_process(
        command=command,
        args=server.args,
        env=get_default_environment() | (server.env or {}),
        errlog=errlog,
        cwd=server.cwd,
    )
    # As in the SDK: no awaits from the spawn until the task group is entered.
    read_stream_writer, read_stream = anyio.create_memory_object_stream[Item](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    shutting_down = False
    writer_done = anyio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        assert process.stdout, "Opened process is missing stdout"
        while True:
            try:
                yield await process.stdout.receive(_READ_BYTES)
            except anyio.EndOfStream:
                return

    async def stdout_reader() -> None:
        try:
            async with read_stream_writer:
                try:
                    # One line at a time; no read-ahead while a delivery is blocked.
                    async for line in read_lines(chunks(), max_line_bytes):
                        try:
                            if isinstance(line, LineTooLong):
                                # The session logs it, naming the connection.
                                await read_stream_writer.send(line)
                                # The session sees the end now, not when the server stops
                                # writing: the drain below discards the rest of the line.
                                await read_stream_writer.aclose()
                                return
                            await read_stream_writer.send(await _parse(*line))
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            return  # the session is gone; only the drain below remains
                finally:
                    await _drain_stdout(process)
        except anyio.ClosedResourceError:
            pass  # our own shutdown closed the stdout stream under the read
        except (anyio.BrokenResourceError, ConnectionError):
            if not shutting_down:
                log.exception("Reading from the MCP server's stdout failed mid-session")

    async def stdin_writer() -> None:
        assert process.stdin, "Opened process is missing stdin"
        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    json = session_message.message.model_dump_json(
                        by_alias=True, exclude_unset=True
                    )
                    data = (json + "\n").encode(
                        encoding=server.encoding, errors=server.encoding_error_handler
                    )
                    await process.stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server may still be alive: close the read stream so the session sees the
            # connection end instead of a request hanging forever.
            await read_stream_writer.aclose()
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT):
            await writer_done.wait()
        await _stop_server_process(process)
        await _aclose_all(read_stream, write_stream, read_stream_writer, write_stream_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as group:
        group.start_soon(stdout_reader)
        group.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            # As in the SDK: shutdown finishes under the caller's cancellation (every wait in
            # it is bounded), or the server process would leak.
            with anyio.CancelScope(shield=True):
                await shutdown()
            group.cancel_scope.cancel()

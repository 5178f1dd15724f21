"""The stdio transport's reader (psych_sidecar/mcp/stdio.py) against real processes
(tests/mcp_servers/stdout_server.py): a line split over many chunks, several lines in one
chunk, a line longer than the limit (a clean error, then the end of the stream, however long
the server goes on writing), lines that are not JSON-RPC (delivered as errors, as the SDK
does, and the reading goes on) and the end of the output in the middle of a line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp.client.stdio import StdioServerParameters
from mcp.shared.message import SessionMessage

from psych_sidecar.config import MIB, McpSettings
from psych_sidecar.mcp import stdio
from psych_sidecar.mcp.stdio import (
    INLINE_PARSE_BYTES,
    RELEASED_LINE_BYTES,
    LineTooLong,
    release_large_result,
    stdio_transport,
)
from tests.mcp_servers.stdout_server import SPLIT_TEXT_BYTES

# The setting's default.
MAX_LINE_BYTES = McpSettings().stdio_max_line_bytes
SERVER = Path(__file__).parent / "mcp_servers" / "stdout_server.py"
# A guard against a hang, not a speed check.
GUARD_SECONDS = 60


def collect(mode: str, count: int | None = None, limit: int = MAX_LINE_BYTES) -> list[Any]:
    """The first `count` items the reader delivers; with no count, every item until the
    stream ends, then the string "end"."""

    async def run(errlog: TextIO) -> list[Any]:
        items: list[Any] = []
        parameters = StdioServerParameters(command=sys.executable, args=[str(SERVER), mode])
        with anyio.fail_after(GUARD_SECONDS):
            async with stdio_transport(parameters, errlog, limit) as (read_stream, _write):
                while count is None or len(items) < count:
                    try:
                        items.append(await read_stream.receive())
                    except anyio.EndOfStream:
                        items.append("end")
                        break
        return items

    with open(os.devnull, "w") as errlog:
        return anyio.run(run, errlog)


def data(item: Any) -> Any:
    assert isinstance(item, SessionMessage), item
    message = item.message
    assert isinstance(message, types.JSONRPCNotification)
    assert message.method == "notifications/message"
    assert message.params is not None
    return message.params["data"]


def test_a_line_in_many_chunks_is_one_message() -> None:
    assert SPLIT_TEXT_BYTES > INLINE_PARSE_BYTES  # parsed on a worker thread
    (item,) = collect("split", count=1)
    assert data(item) == {"index": 0, "text": "é" * (SPLIT_TEXT_BYTES // 2)}


def test_several_lines_in_one_chunk_are_several_messages_in_order() -> None:
    items = collect("many", count=5)
    assert [data(item)["index"] for item in items] == [0, 1, 2, 3, 4]


def test_a_line_over_the_limit_is_a_clean_error_and_ends_the_stream() -> None:
    # The server writes one line without end; the reader stops at the limit instead of
    # holding everything it is sent.
    items = collect("endless", limit=MIB)
    assert len(items) == 2, items
    error, end = items
    assert isinstance(error, LineTooLong)
    assert f"more than {MIB} bytes" in str(error)
    assert end == "end"


def test_lines_that_are_not_json_rpc_are_errors_and_reading_goes_on() -> None:
    items = collect("garbage", count=4)
    assert all(isinstance(item, ValueError) for item in items[:3]), items
    assert data(items[3]) == {"index": 7, "text": ""}


def test_output_ending_mid_line_delivers_the_whole_lines_then_ends() -> None:
    items = collect("eof_mid_line")
    assert len(items) == 2, items
    assert data(items[0]) == {"index": 1, "text": ""}
    assert items[1] == "end"


def _large_response(text: str) -> SessionMessage:
    result = {"content": [{"type": "text", "text": text}], "isError": False}
    line = json.dumps({"jsonrpc": "2.0", "id": 7, "result": result}).encode()
    assert len(line) > RELEASED_LINE_BYTES
    item = stdio._parse_pieces([line])
    assert isinstance(item, SessionMessage)
    return item


def test_a_large_response_is_emptied_once_its_call_is_done_with_it() -> None:
    # The SDK's read loop keeps the last message it dispatched until the next one arrives.
    kept = _large_response("a" * (2 * MIB))
    other = _large_response("a" * (2 * MIB))
    response = kept.message
    assert isinstance(response, types.JSONRPCResponse)
    result = types.CallToolResult.model_validate(response.result, by_name=False)
    release_large_result(result)
    assert response.result == {}
    # Another response with an equal text is not the one the call was validated from.
    assert isinstance(other.message, types.JSONRPCResponse)
    assert other.message.result["content"][0]["text"] == "a" * (2 * MIB)

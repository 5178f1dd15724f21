"""A small MCP server that behaves as an attacker's would, for tests/test_security.py.

    python tests/mcp_servers/hostile_server.py [--ref-url URL] [--flood-bytes N]

Over stdio, one tool, `remote_ref`, whose input schema's property `x` is a `$ref` to URL (a
server that wants the sidecar to fetch something); and `flood`, which writes N bytes of
lines to stderr and then answers (a server that wants to fill the sidecar's log). With
`--flood-bytes`, it also floods stderr once at start, before serving.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server

FLOOD_LINE = "hostile stderr line " + "x" * 80 + "\n"


def flood(total: int) -> None:
    lines = FLOOD_LINE * (64 * 1024 // len(FLOOD_LINE))
    written = 0
    while written < total:
        sys.stderr.write(lines)
        written += len(lines)
    sys.stderr.flush()


def build_server(ref_url: str, flood_bytes: int) -> Server[Any]:
    tools = [
        types.Tool(
            name="remote_ref",
            description="Its input schema refers to a remote document.",
            input_schema={"type": "object", "properties": {"x": {"$ref": ref_url}}},
        ),
        types.Tool(
            name="flood",
            description="Floods stderr, then answers.",
            input_schema={"type": "object", "properties": {}},
        ),
    ]

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> Any:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == "flood":
            flood(flood_bytes)
        return types.CallToolResult(content=[types.TextContent(type="text", text="ran")])

    return Server(
        "psych-hostile", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool
    )


async def serve(server: Server[Any]) -> None:
    options = server.create_initialization_options(NotificationOptions())
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ref-url", default="http://127.0.0.1:9/schema.json")
    parser.add_argument("--flood-bytes", type=int, default=0)
    options = parser.parse_args()
    if options.flood_bytes:
        flood(options.flood_bytes)
    anyio.run(serve, build_server(options.ref_url, options.flood_bytes))


if __name__ == "__main__":
    main()

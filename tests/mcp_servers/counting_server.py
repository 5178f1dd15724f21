"""An MCP test server (stdio) that counts the calls it runs, for retry-safety tests.

    python tests/mcp_servers/counting_server.py

- `count`: runs once more and answers `call N` (N: how many `count` calls this process has
  run), after sleeping `delay` seconds if given — long enough for a retry to arrive while
  the first call is still running;
- `calls`: answers how many `count` calls have run, without counting itself.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server

TOOLS = [
    types.Tool(
        name="count",
        description="Counts this call and answers with the count.",
        input_schema={"type": "object", "properties": {"delay": {"type": "number"}}},
    ),
    types.Tool(
        name="calls",
        description="How many count calls have run.",
        input_schema={"type": "object", "properties": {}},
    ),
]


def build_server() -> Server[Any]:
    runs = 0

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        nonlocal runs
        arguments = params.arguments or {}
        if params.name == "calls":
            return types.CallToolResult(content=[types.TextContent(type="text", text=str(runs))])
        runs += 1
        number = runs
        await anyio.sleep(float(arguments.get("delay", 0)))
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"call {number}")])

    return Server(
        "psych-counting", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool
    )


async def main() -> None:
    server = build_server()
    options = server.create_initialization_options(NotificationOptions())
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, options)


if __name__ == "__main__":
    anyio.run(main)

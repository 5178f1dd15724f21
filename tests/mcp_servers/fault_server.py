"""An MCP test server (stdio) that misbehaves on request, for the fault-matrix tests.

    python tests/mcp_servers/fault_server.py [--tools N] [--list-delay S] [--garbage-first]

- `--tools N`: N generated tools `tool_00000`… besides the fixed ones (10,000 is a test);
- `--list-delay S`: every tools/list answers after S seconds;
- `--garbage-first`: lines that are not JSON-RPC on stdout before the session starts;
- tools: `ok` (answers "ok"), `garbage` (writes non-JSON lines to stdout, then answers),
  `stderr_flood` (writes `mb` MiB to stderr, then answers), `hang` (never answers),
  `exit` (the process dies mid-call), `flood` (`count` tools/list_changed notifications).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged

_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
FIXED = [
    types.Tool(name=name, description=description, input_schema=_OBJECT)
    for name, description in [
        ("ok", "Answers ok."),
        ("garbage", "Writes lines that are not JSON-RPC to stdout, then answers."),
        ("stderr_flood", "Writes mb MiB to stderr, then answers."),
        ("hang", "Never answers."),
        ("exit", "Ends the process mid-call."),
        ("flood", "Announces tools/list_changed `count` times, then answers."),
    ]
]


def build_server(tool_count: int, list_delay: float) -> Server[Any]:
    bus = InMemorySubscriptionBus()
    generated = [
        types.Tool(
            name=f"tool_{index:05d}",
            description=f"Generated tool number {index} of a very large catalogue.",
            input_schema=_OBJECT,
        )
        for index in range(tool_count)
    ]

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        await anyio.sleep(list_delay)
        return types.ListToolsResult(tools=[*FIXED, *generated])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        match params.name:
            case "garbage":
                os.write(1, b'this is not JSON-RPC\n{"half": \n\x00\xff\n')
            case "stderr_flood":
                chunk = b"e" * 65536 + b"\n"
                for _ in range(int(arguments.get("mb", 20)) * 16):
                    os.write(2, chunk)
            case "hang":
                await anyio.sleep_forever()
            case "exit":
                os._exit(3)
            case "flood":
                for _ in range(int(arguments.get("count", 1000))):
                    if ctx.protocol_version == "2025-11-25":
                        await ctx.session.send_tool_list_changed()
                    await bus.publish(ToolsListChanged())
        return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])

    return Server(
        "psych-faults",
        version="1.0.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_subscriptions_listen=ListenHandler(bus),
    )


async def main(options: argparse.Namespace) -> None:
    server = build_server(options.tools, options.list_delay)
    if options.garbage_first:
        os.write(1, b"starting up...\nnot json either\n")
    init = server.create_initialization_options(NotificationOptions())
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, init)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=0)
    parser.add_argument("--list-delay", type=float, default=0.0)
    parser.add_argument("--garbage-first", action="store_true")
    anyio.run(main, parser.parse_args())
    sys.exit(0)

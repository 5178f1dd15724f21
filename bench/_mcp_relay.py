"""The floor of a gRPC-to-MCP gateway: a bare grpc.aio server relaying each call to an MCP server.

Run as ``python -m bench._mcp_relay --listen HOST:PORT --url MCP_URL``; stops on SIGTERM or
SIGINT. One generic unary method takes a JSON object ``{"tool": NAME, "arguments": {...}}``,
calls the tool through one MCP SDK ``Client`` session opened at start, and answers the
``CallToolResult`` as JSON. No storage, no argument validation, no per-call logging: the least
any gateway built on grpc.aio and the MCP SDK does per call, an extra process hop and the SDK
client's own work. It listens only once the session is open, so the first call it answers is
ready to relay.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import grpc.aio
from mcp import Client

from bench._echo_server import serve_bytes_method

SERVICE = "bench.McpRelay"
METHOD = "CallTool"
CALL_TOOL_METHOD = f"/{SERVICE}/{METHOD}"


async def serve(listen: str, url: str) -> None:
    async with Client(url) as client:

        async def call_tool(
            request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
        ) -> bytes:
            call = json.loads(request)
            result = await client.call_tool(call["tool"], call["arguments"])
            return result.model_dump_json(by_alias=True, exclude_none=True).encode()

        await serve_bytes_method(listen, SERVICE, METHOD, call_tool, f"MCP relay to {url}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    parser.add_argument("--url", required=True, help="the MCP server's streamable-HTTP URL")
    args = parser.parse_args()
    asyncio.run(serve(args.listen, args.url))


if __name__ == "__main__":
    main()

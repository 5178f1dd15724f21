"""A bare streamable-HTTP MCP endpoint that records what its client sends: for tests of how
the sidecar introduces itself and of how it reports a server that refuses it.

    python tests/mcp_servers/recording_server.py --port P
        [--refuse 401|403 [--challenge TEXT] [--only-calls]]

POST /mcp records each JSON-RPC message. With `--refuse` every one (with `--only-calls`, every
tools/call) is answered with that HTTP status, and TEXT (if given) as the WWW-Authenticate
header, as a server wanting OAuth (or a scope it was not granted) does. Otherwise it answers as
a 2025-11-25 server with one tool, `guarded`, that no call reaches: `initialize` with its
result, `tools/list` with the tool, a notification with 202 and any other request with an
empty result (which a client probing `server/discover` takes for a legacy server). GET /mcp (the
listening stream, or an SSE client's stream) is 405, or the refusal. GET /recorded returns the
recorded messages as a JSON array.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def build_app(refuse: int | None, challenge: str, only_calls: bool) -> Starlette:
    recorded: list[Any] = []

    def refusal() -> Response:
        headers = {"WWW-Authenticate": challenge} if challenge else {}
        return Response(status_code=refuse or 401, headers=headers)

    async def mcp(request: Request) -> Response:
        if request.method != "POST":
            return refusal() if refuse is not None and not only_calls else Response(status_code=405)
        message = json.loads(await request.body())
        recorded.append(message)
        if refuse is not None and (not only_calls or message.get("method") == "tools/call"):
            return refusal()
        if "id" not in message:
            return Response(status_code=202)
        result: dict[str, Any] = {}
        if message.get("method") == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "serverInfo": {"name": "recording-server", "version": "1.0.0"},
                "capabilities": {"tools": {}},
            }
        elif message.get("method") == "tools/list":
            result = {"tools": [{"name": "guarded", "inputSchema": {"type": "object"}}]}
        return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": result})

    async def recorded_messages(_request: Request) -> Response:
        return JSONResponse(recorded)

    return Starlette(
        routes=[
            Route("/mcp", mcp, methods=["GET", "POST", "DELETE"]),
            Route("/recorded", recorded_messages),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--refuse", type=int, choices=[401, 403])
    parser.add_argument("--challenge", default="")
    parser.add_argument("--only-calls", action="store_true")
    options = parser.parse_args()
    app = build_app(options.refuse, options.challenge, options.only_calls)
    uvicorn.run(app, host="127.0.0.1", port=options.port, log_level="warning")


if __name__ == "__main__":
    main()

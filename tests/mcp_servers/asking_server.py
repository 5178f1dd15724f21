"""An MCP test server (stdio, the SDK's lowlevel Server) whose tools ask the user for input
before they answer, in either protocol era.

    python tests/mcp_servers/asking_server.py [--era auto|legacy]

On 2026-07-28 (`--era auto`, the default) a tool answers `resultType: "input_required"` with
its input requests and a request state, sealed with an HMAC (the same key in every process):
the repeated call must carry the answers and the state unchanged (a missing or tampered state
is a JSON-RPC error). On
2025-11-25 (`--era legacy`: server/discover refused) the same tools send `elicitation/create`
while the call is open and wait for the answer. Tools:

- `ask_name`: one form (`name`, default "Ada"); answers `hello NAME`; a decline or cancel
  answers a tool error `the user declined` / `the user cancelled`;
- `ask_twice`: a form for `name`, then (a second round) one for `age`; answers `NAME is AGE`;
- `ask_many`: two forms in one round (`name`, `color`); answers `NAME likes COLOR`;
- `open_url`: a URL for the user to open (`https://sign-in.invalid/start`); answers
  `url accepted` (or the action);
- `no_state`: (2026-07-28) a form and no request state; answers `state: none` when the
  repeated call carries none (else `state: SENT`);
- `calls`: how many tools/calls this process answered with a final result.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

# Every process of this server seals with the same key, as the instances of a real stateless
# server share theirs: a state sealed by one opens in another.
KEY = hashlib.sha256(b"asking-server test key").digest()
URL = "https://sign-in.invalid/start"


def _form(name: str, default: str = "") -> dict[str, Any]:
    prop: dict[str, Any] = {"type": "string", "description": f"Your {name}"}
    if default:
        prop["default"] = default
    return {"type": "object", "properties": {name: prop}, "required": [name]}


QUESTIONS: dict[str, list[list[tuple[str, str, dict[str, Any]]]]] = {
    # tool: rounds; a round: (key, message, schema) per request
    "ask_name": [[("name", "What is your name?", _form("name", "Ada"))]],
    "ask_twice": [
        [("name", "What is your name?", _form("name"))],
        [("age", "How old are you?", _form("age"))],
    ],
    "ask_many": [
        [
            ("name", "What is your name?", _form("name")),
            ("color", "What is your favourite colour?", _form("color")),
        ]
    ],
    "no_state": [[("ok", "Go on?", _form("ok"))]],
}
TOOLS = [
    types.Tool(name=name, description=f"Asks first: {name}.", input_schema={"type": "object"})
    for name in [*QUESTIONS, "open_url", "calls"]
]


def _seal(state: dict[str, Any]) -> str:
    body = json.dumps(state, sort_keys=True)
    tag = hmac.new(KEY, body.encode(), hashlib.sha256).hexdigest()
    return json.dumps({"body": body, "tag": tag})


def _open(sealed: str | None) -> dict[str, Any]:
    if sealed is None:
        raise MCPError(code=types.INVALID_PARAMS, message="requestState is missing")
    try:
        outer = json.loads(sealed)
        body, tag = outer["body"], outer["tag"]
    except (ValueError, KeyError, TypeError):
        raise MCPError(code=types.INVALID_PARAMS, message="requestState is not ours") from None
    want = hmac.new(KEY, body.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, tag):
        raise MCPError(code=types.INVALID_PARAMS, message="requestState was tampered with")
    state: dict[str, Any] = json.loads(body)
    return state


def _text(value: str, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=value)], is_error=error
    )


def _final(tool: str, answers: dict[str, Any]) -> types.CallToolResult:
    if tool == "ask_name":
        return _text(f"hello {answers['name']}")
    if tool == "ask_twice":
        return _text(f"{answers['name']} is {answers['age']}")
    if tool == "ask_many":
        return _text(f"{answers['name']} likes {answers['color']}")
    return _text("done")


def build_server() -> Server[Any]:
    finished = 0

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    def refused(result: types.ElicitResult) -> types.CallToolResult | None:
        if result.action == "accept":
            return None
        return _text(
            {"decline": "the user declined"}.get(result.action, "the user cancelled"), True
        )

    async def legacy(ctx: Any, tool: str) -> types.CallToolResult:
        session = ctx.session
        if tool == "open_url":
            result = await session.elicit_url(
                "Sign in to the tracker", URL, "sign-in-1", related_request_id=ctx.request_id
            )
            return refused(result) or _text("url accepted")
        answers: dict[str, Any] = {}
        for round_ in QUESTIONS[tool]:
            for key, message, schema in round_:
                result = await session.elicit_form(
                    message, schema, related_request_id=ctx.request_id
                )
                if (no := refused(result)) is not None:
                    return no
                answers[key] = (result.content or {}).get(key)
        return _final(tool, answers)

    def modern(
        tool: str, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        responses = params.input_responses or {}
        if tool == "open_url":
            if not responses:
                request = types.ElicitRequest(
                    params=types.ElicitRequestURLParams(message="Sign in to the tracker", url=URL)
                )
                return types.InputRequiredResult(
                    input_requests={"sign_in": request}, request_state=_seal({"round": 0})
                )
            _open(params.request_state)
            answer = responses["sign_in"]
            assert isinstance(answer, types.ElicitResult)
            return refused(answer) or _text("url accepted")
        rounds = QUESTIONS[tool]
        if tool == "no_state":
            if not responses:
                ((key, message, schema),) = rounds[0]
                return types.InputRequiredResult(input_requests={key: _ask(message, schema)})
            return _text(f"state: {params.request_state or 'none'}")
        if not responses:
            state: dict[str, Any] = {"round": 0, "answers": {}}
        else:
            state = _open(params.request_state)
            for key, _message, _schema in rounds[state["round"]]:
                given = responses.get(key)
                if not isinstance(given, types.ElicitResult):
                    raise MCPError(code=types.INVALID_PARAMS, message=f"no answer for {key}")
                if (no := refused(given)) is not None:
                    return no
                state["answers"][key] = (given.content or {}).get(key)
            state["round"] += 1
        if state["round"] < len(rounds):
            asked: types.InputRequests = {
                key: _ask(message, schema) for key, message, schema in rounds[state["round"]]
            }
            return types.InputRequiredResult(input_requests=asked, request_state=_seal(state))
        return _final(tool, state["answers"])

    async def call_tool(
        ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        nonlocal finished
        if params.name == "calls":
            return _text(str(finished))
        if params.name not in QUESTIONS and params.name != "open_url":
            return _text(f"unknown tool {params.name}", True)
        if ctx.protocol_version == "2026-07-28":
            result = modern(params.name, params)
        else:
            result = await legacy(ctx, params.name)
        if isinstance(result, types.CallToolResult):
            finished += 1
        return result

    return Server("psych-asking", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool)


def _ask(message: str, schema: dict[str, Any]) -> types.ElicitRequest:
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=message, requested_schema=schema)
    )


async def serve(era: str) -> None:
    server = build_server()
    options = server.create_initialization_options(NotificationOptions())
    async with stdio_server() as (read_stream, write_stream):
        if era == "auto":
            await server.run(read_stream, write_stream, options)
            return
        # Handshake only: server/discover is refused, so a client falls back to 2025-11-25.
        async with server.lifespan(server) as state:
            await serve_loop(
                server, read_stream, write_stream, lifespan_state=state, init_options=options
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--era", choices=["auto", "legacy"], default="auto")
    anyio.run(serve, parser.parse_args().era)


if __name__ == "__main__":
    main()

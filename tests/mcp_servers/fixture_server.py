"""The project's own MCP test server, written with the MCP SDK's lowlevel Server.

    python tests/mcp_servers/fixture_server.py stdio [--tools N] [--page-size K] [--era E]
        [--no-listen] [--invalid-tools one|all] [--output-schema-faults] [--asking-tools]
    python tests/mcp_servers/fixture_server.py http --port P [--tools N] [--page-size K] [--era E]

It serves both protocol eras (2026-07-28 via server/discover, 2025-11-25 via the initialize
handshake); `--era legacy` refuses server/discover, so a client in auto mode falls back to
2025-11-25. It has what the sidecar's tests need that third-party servers lack:

- a paginated tools/list (`--tools` generated tools `bulk_000`…, `--page-size` per page);
- `add_tool` / `remove_tool`, which change the listing at runtime and announce it with
  notifications/tools/list_changed in either era (unless `notify` is false);
- results of every content kind: `huge_text` (any size), `image`, `audio`, `blob` (optional
  `size` in bytes),
  `resource_text`, `resource_link`, `structured` (optional `size`, `text: false` for
  no text block, `image: true` for an image block);
- failures: `fail` (a plain exception: is_error with the message withheld), `tool_error`
  (is_error with a message), `hang` (never answers), `exit` (the process dies mid-call);
- with `--output-schema-faults`, results that break the tool's own `outputSchema`:
  `wrong_structured` (`{"y": 1}` where a string is declared), `missing_structured` (no
  `structuredContent` at all), `remote_ref_output` (its output schema's property is a `$ref` to
  a URL);
- listings that break the spec (stdio; the SDK would refuse to send them, so they are broken on
  the wire): `--invalid-tools one` adds `bad_schema`, whose input schema has no top-level
  `type`, until `repair_listing` is called (which announces tools/list_changed);
  `--invalid-tools all` sends every tool's input schema without its `type`;
- with `--data-tools`, seeded JSON listings and a consumer of ids, for the data-task benchmark
  (bench/cases/result_queries.py): `listing` (`kind` tickets, users or orders; `count`; `seed`)
  returns `{"items": [...]}` as text, one record per line, and `take_ids` (`ids`, an array of
  strings) answers how many it got and their SHA-256;
- `pid`, `protocol_version` and `echo` for bookkeeping;
- 2026-07-28 client duties: `--list-ttl-ms` sets tools/list's `ttlMs`; `--client-duty-tools`
  lists a tool whose name is outside the spec's naming rules and one with an optional boolean;
  over http, `--require-standard-headers` refuses a request without `Mcp-Method` (and
  `Mcp-Name` on tools/call) with 400;
- with `--tasks`, the tools and tasks of task_server.py (the MCP tasks extension);
- with `--asking-tools`, `ask`, which asks the user's name first (2026-07-28 input_required,
  see `ASK_STATE`), for the contract suite's ContinueToolCall scenarios.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import string
import sys
from typing import TYPE_CHECKING, Any, TypedDict

import anyio
import mcp_types as types
import uvicorn
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.message import SessionMessage

# A type checker reads this file as part of the tests package.
if TYPE_CHECKING or __package__:
    from tests.mcp_servers.task_server import TaskJobs
else:  # run as a script: its directory is on the path
    from task_server import TaskJobs

# A 1x1 transparent PNG.
PNG_BYTES = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
BLOB_BYTES = bytes(range(256))
WAV_BYTES = b"RIFF\x24\x00\x00\x00WAVEfmt "

_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
# Nothing listens there: a client that tried to fetch it would fail (or hang on a firewall).
REMOTE_SCHEMA_URL = "http://127.0.0.1:9/schema.json"
# An input schema without a top-level `type`, as some servers send: valid JSON Schema, but
# not the object schema MCP requires of a tool's input.
UNTYPED_SCHEMA: dict[str, Any] = {
    "$ref": "#/$defs/arguments",
    "$defs": {"arguments": {"type": "object", "properties": {}}},
}
BAD_SCHEMA_TOOL = "bad_schema"
# Listed with `--client-duty-tools`. A name outside the MCP spec's naming rules (a SHOULD: a
# space, a comma, a non-ASCII letter); over HTTP its Mcp-Name header must be Base64-encoded.
ODD_NAME_TOOL = types.Tool(
    name="odd name, ü",
    description="A tool whose name is outside the spec's naming rules.",
    input_schema={"type": "object", "properties": {}},
)
# An optional boolean the call may give as null: the server judges it (it answers with the
# arguments it got, as JSON).
OPTIONAL_FLAG_TOOL = types.Tool(
    name="optional_flag",
    description="Returns the arguments it got, as JSON.",
    input_schema={
        "type": "object",
        "properties": {"verbose": {"type": "boolean", "x-mcp-header": "Verbose"}},
    },
)


def _blob_bytes(size: int | None) -> bytes:
    """BLOB_BYTES, or `size` bytes of it repeated."""
    if size is None:
        return BLOB_BYTES
    return (BLOB_BYTES * (int(size) // len(BLOB_BYTES) + 1))[: int(size)]


def _schema(**properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties)}


FIXED_TOOLS = [
    types.Tool(
        name="echo",
        description="Returns its text argument.",
        input_schema=_schema(text={"type": "string"}),
    ),
    types.Tool(name="pid", description="Returns the server's process id.", input_schema=_OBJECT),
    types.Tool(
        name="getenv",
        description="Returns the value of the environment variable `name`.",
        input_schema=_schema(name={"type": "string"}),
    ),
    types.Tool(
        name="protocol_version",
        description="Returns the protocol version of the calling session.",
        input_schema=_OBJECT,
    ),
    types.Tool(
        name="add_tool",
        description="Adds (or replaces) a tool named `name`; announces tools/list_changed "
        "unless `notify` is false.",
        input_schema={
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "description": {"type": "string"},
                "notify": {"type": "boolean"},
            },
            "required": ["name"],
        },
    ),
    types.Tool(
        name="remove_tool",
        description="Removes a tool added by add_tool and announces tools/list_changed.",
        input_schema=_schema(name={"type": "string"}),
    ),
    types.Tool(
        name="huge_text",
        # `x`s, or with `seed` pseudo-random letters and digits that no database compresses.
        description="Returns `size` characters of text.",
        input_schema={
            "type": "object",
            "properties": {
                "size": {"type": "integer", "minimum": 0},
                "seed": {"type": "integer"},
            },
            "required": ["size"],
        },
    ),
    types.Tool(name="image", description="Returns a PNG image.", input_schema=_OBJECT),
    types.Tool(name="audio", description="Returns WAV audio.", input_schema=_OBJECT),
    types.Tool(
        name="blob",
        description="Returns an embedded binary resource (of `size` bytes when given).",
        input_schema={
            "type": "object",
            "properties": {"size": {"type": "integer", "minimum": 0}},
        },
    ),
    types.Tool(
        name="resource_text", description="Returns an embedded text resource.", input_schema=_OBJECT
    ),
    types.Tool(name="resource_link", description="Returns a resource link.", input_schema=_OBJECT),
    types.Tool(
        name="structured",
        description="Returns structured content with a text rendering.",
        input_schema=_OBJECT,
        output_schema=_schema(answer={"type": "integer"}),
    ),
    types.Tool(name="fail", description="Raises a plain exception.", input_schema=_OBJECT),
    types.Tool(
        name="tool_error", description="Returns is_error with a message.", input_schema=_OBJECT
    ),
    types.Tool(name="hang", description="Never answers.", input_schema=_OBJECT),
    types.Tool(name="exit", description="Ends the server process mid-call.", input_schema=_OBJECT),
]


# Listed only with --output-schema-faults, so the stock catalogue (which many tests count)
# stays as it is.
OUTPUT_SCHEMA_FAULTS = [
    types.Tool(
        name="wrong_structured",
        description="Returns structured content that breaks its output schema.",
        input_schema=_OBJECT,
        output_schema=_schema(y={"type": "string"}),
    ),
    types.Tool(
        name="missing_structured",
        description="Declares an output schema and returns no structured content.",
        input_schema=_OBJECT,
        output_schema=_schema(y={"type": "string"}),
    ),
    types.Tool(
        name="remote_ref_output",
        description="Its output schema's property is a $ref to a remote document.",
        input_schema=_OBJECT,
        output_schema=_schema(y={"$ref": REMOTE_SCHEMA_URL}),
    ),
]


# Listed only with --asking-tools (2026-07-28): `ask` answers input_required with one form
# (`name`, default "Ada") and the request state ASK_STATE, then `hello NAME` when repeated with
# the answer and that state unchanged (a decline: a tool error `declined`).
ASK_STATE = "fixture-ask-1"
ASKING_TOOLS = [
    types.Tool(name="ask", description="Asks the user's name first.", input_schema=_OBJECT)
]


def ask(params: types.CallToolRequestParams) -> types.CallToolResult | types.InputRequiredResult:
    answer = (params.input_responses or {}).get("name")
    if not isinstance(answer, types.ElicitResult):
        schema = {"type": "object", "properties": {"name": {"type": "string", "default": "Ada"}}}
        question = types.ElicitRequest(
            params=types.ElicitRequestFormParams(message="Your name?", requested_schema=schema)
        )
        return types.InputRequiredResult(input_requests={"name": question}, request_state=ASK_STATE)
    if params.request_state != ASK_STATE:
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="request state not echoed")], is_error=True
        )
    if answer.action != "accept":
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"{answer.action}d")], is_error=True
        )
    name = (answer.content or {}).get("name")
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"hello {name}")])


# Listed only with --data-tools, so the stock catalogue stays as it is.
DATA_TOOLS = [
    types.Tool(
        name="listing",
        description="Returns a seeded JSON listing of tickets, users or orders.",
        input_schema={
            "type": "object",
            "properties": {
                "kind": {"type": "string", "enum": ["tickets", "users", "orders"]},
                "count": {"type": "integer", "minimum": 0},
                "users": {"type": "integer", "minimum": 1},
                "seed": {"type": "integer"},
            },
            "required": ["kind", "count", "seed"],
        },
    ),
    types.Tool(
        name="take_ids",
        description="Takes a list of ids; answers how many it got and their SHA-256.",
        input_schema={
            "type": "object",
            "properties": {"ids": {"type": "array", "items": {"type": "string"}}},
            "required": ["ids"],
        },
    ),
]
_NAMES = ["Ana", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal", "Ivy", "Jo", "Kai", "Lu"]
_WORDS = ["db", "ui", "api", "auth", "perf", "login", "cache", "queue", "disk", "mail"]
_TAGS = ["security", "billing", "infra", "mobile", "web", "data", "docs", "ops"]
_COUNTRIES = [f"{a}{b}" for a in "ABCDEFGHIJ" for b in "OSE"]


def data_listing(kind: str, count: int, seed: int, users: int = 1000) -> str:
    """`{"items": [...]}`, one record per line: what the `listing` tool returns."""
    rng = random.Random(f"{kind}:{seed}")
    records: list[dict[str, Any]] = []
    for index in range(count):
        if kind == "tickets":
            records.append(
                {
                    "id": f"T-{index:06d}",
                    "status": rng.choice(["open", "closed", "pending", "resolved"]),
                    "assignee": rng.choice(_NAMES),
                    "priority": rng.randint(1, 5),
                    "tags": rng.sample(_TAGS, 2),
                    "title": " ".join(rng.choices(_WORDS, k=8)),
                    "created": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                }
            )
        elif kind == "users":
            records.append(
                {
                    "id": f"U-{index:05d}",
                    "name": f"{rng.choice(_NAMES)} {rng.choice(_WORDS).title()}",
                    "country": "NO" if rng.random() < 0.02 else rng.choice(_COUNTRIES),
                    "plan": rng.choice(["free", "pro", "team"]),
                }
            )
        else:
            records.append(
                {
                    "id": f"O-{index:07d}",
                    "user_id": f"U-{rng.randrange(users):05d}",
                    "status": rng.choice(["paid", "refunded", "open"]),
                    "amount": rng.randint(100, 50_000),
                }
            )
    lines = ",\n".join(json.dumps(r, separators=(",", ":")) for r in records)
    return '{"items":[\n' + lines + "\n]}"


class Listing:
    """Which listed tools are broken on the wire (see `BreakingWriter`)."""

    def __init__(
        self,
        invalid_tools: str,
        output_schema_faults: bool = False,
        data_tools: bool = False,
        *,
        ttl_ms: int | None = None,
        client_duty_tools: bool = False,
        asking_tools: bool = False,
    ) -> None:
        self.invalid_tools = invalid_tools
        self.output_schema_faults = output_schema_faults
        self.data_tools = data_tools
        # The listing's 2026-07-28 ttlMs (None: the SDK's default, 0).
        self.ttl_ms = ttl_ms
        # Whether ODD_NAME_TOOL and OPTIONAL_FLAG_TOOL are listed.
        self.client_duty_tools = client_duty_tools
        self.asking_tools = asking_tools
        self.repaired = False

    def breaks(self, name: object) -> bool:
        if self.invalid_tools == "all":
            return True
        return self.invalid_tools == "one" and not self.repaired and name == BAD_SCHEMA_TOOL


class ListingHints(TypedDict, total=False):
    """tools/list's cache hints the listing sets; one left out stays unset, for the SDK to
    fill in."""

    ttl_ms: int


class BreakingWriter:
    """The server's write stream, through which every tools/list answer passes: the input
    schemas of the tools `listing` breaks lose their top-level `type` on the way out."""

    def __init__(self, inner: Any, listing: Listing) -> None:
        self._inner = inner
        self._listing = listing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCResponse):
            tools = message.result.get("tools")
            for tool in tools if isinstance(tools, list) else []:
                if self._listing.breaks(tool.get("name")):
                    tool["inputSchema"] = UNTYPED_SCHEMA
        await self._inner.send(item)

    async def __aenter__(self) -> BreakingWriter:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)


def build_server(
    tool_count: int,
    page_size: int,
    listen: bool = True,
    listing_faults: Listing | None = None,
    jobs: TaskJobs | None = None,
) -> Server[Any]:
    bus = InMemorySubscriptionBus()
    added: dict[str, types.Tool] = {}
    faults = listing_faults or Listing("")
    bad_schema = types.Tool(
        name=BAD_SCHEMA_TOOL,
        description="Listed with an input schema that has no top-level type, until repaired.",
        input_schema=_OBJECT,
    )
    repair = types.Tool(
        name="repair_listing",
        description="Lists bad_schema with a valid input schema from now on.",
        input_schema=_OBJECT,
    )

    def listing() -> list[types.Tool]:
        bulk = [
            types.Tool(
                name=f"bulk_{index:03d}",
                description=f"Generated tool number {index}.",
                input_schema=_schema(value={"type": "string"}),
            )
            for index in range(tool_count)
        ]
        broken = [bad_schema, repair] if faults.invalid_tools == "one" else []
        faulty = OUTPUT_SCHEMA_FAULTS if faults.output_schema_faults else []
        data = DATA_TOOLS if faults.data_tools else []
        odd = [ODD_NAME_TOOL, OPTIONAL_FLAG_TOOL] if faults.client_duty_tools else []
        odd += [] if jobs is None else jobs.tools
        asking = ASKING_TOOLS if faults.asking_tools else []
        return [*FIXED_TOOLS, *faulty, *data, *asking, *odd, *bulk, *broken, *added.values()]

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = listing()
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + page_size
        hints: ListingHints = {} if faults.ttl_ms is None else {"ttl_ms": faults.ttl_ms}
        return types.ListToolsResult(
            tools=tools[start:end],
            next_cursor=str(end) if end < len(tools) else None,
            **hints,
        )

    async def announce(ctx: Any) -> None:
        # Handshake-era clients get the notification on the session; 2026-era clients
        # only through their subscriptions/listen stream, which the bus feeds.
        if ctx.protocol_version == "2025-11-25":
            await ctx.session.send_tool_list_changed()
        await bus.publish(ToolsListChanged())

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
        # A CallToolResult, an InputRequiredResult (`ask`) or a task's answer (`jobs`).
        if jobs is not None and params.name in jobs.names:
            return await jobs.call_tool(params)
        arguments = params.arguments or {}
        text = types.TextContent
        match params.name:
            case "ask" if faults.asking_tools:
                return ask(params)
            case "echo":
                return types.CallToolResult(content=[text(type="text", text=arguments["text"])])
            case name if name == ODD_NAME_TOOL.name:
                return types.CallToolResult(content=[text(type="text", text=f"{name} ran")])
            case "optional_flag":
                got = json.dumps(arguments, sort_keys=True)
                return types.CallToolResult(content=[text(type="text", text=got)])
            case "listing":
                body = data_listing(
                    arguments["kind"],
                    int(arguments["count"]),
                    int(arguments["seed"]),
                    int(arguments.get("users", 1000)),
                )
                return types.CallToolResult(content=[text(type="text", text=body)])
            case "take_ids":
                ids = list(arguments["ids"])
                digest = hashlib.sha256(",".join(ids).encode()).hexdigest()
                answer = json.dumps({"received": len(ids), "sha256": digest})
                return types.CallToolResult(content=[text(type="text", text=answer)])
            case "pid":
                return types.CallToolResult(content=[text(type="text", text=str(os.getpid()))])
            case "getenv":
                value = os.environ.get(arguments["name"], "")
                return types.CallToolResult(content=[text(type="text", text=value)])
            case "protocol_version":
                return types.CallToolResult(content=[text(type="text", text=ctx.protocol_version)])
            case "add_tool":
                name = arguments["name"]
                description = arguments.get("description", f"Added at runtime: {name}.")
                added[name] = types.Tool(name=name, description=description, input_schema=_OBJECT)
                if arguments.get("notify", True):
                    await announce(ctx)
                return types.CallToolResult(content=[text(type="text", text=f"added {name}")])
            case "remove_tool":
                added.pop(arguments["name"], None)
                await announce(ctx)
                return types.CallToolResult(content=[text(type="text", text="removed")])
            case "huge_text":
                size = int(arguments["size"])
                if "seed" in arguments:
                    letters = string.ascii_letters + string.digits
                    body = "".join(random.Random(arguments["seed"]).choices(letters, k=size))
                else:
                    body = "x" * size
                return types.CallToolResult(content=[text(type="text", text=body)])
            case "image":
                data = base64.b64encode(PNG_BYTES).decode()
                return types.CallToolResult(
                    content=[types.ImageContent(type="image", data=data, mime_type="image/png")]
                )
            case "audio":
                data = base64.b64encode(WAV_BYTES).decode()
                return types.CallToolResult(
                    content=[types.AudioContent(type="audio", data=data, mime_type="audio/wav")]
                )
            case "blob":
                resource = types.BlobResourceContents(
                    uri="file:///blob.bin",
                    mime_type="application/octet-stream",
                    blob=base64.b64encode(_blob_bytes(arguments.get("size"))).decode(),
                )
                return types.CallToolResult(
                    content=[types.EmbeddedResource(type="resource", resource=resource)]
                )
            case "resource_text":
                resource_text = types.TextResourceContents(
                    uri="file:///notes.txt", mime_type="text/plain", text="embedded notes"
                )
                return types.CallToolResult(
                    content=[types.EmbeddedResource(type="resource", resource=resource_text)]
                )
            case "resource_link":
                link = types.ResourceLink(
                    type="resource_link", uri="file:///report.pdf", name="report"
                )
                return types.CallToolResult(content=[link])
            case "structured":
                # Optional arguments: `size` adds that many characters to the value, and
                # `text: false` leaves out the text rendering MCP asks servers to include.
                structured: dict[str, Any] = {"answer": 42}
                if arguments.get("size"):
                    structured["content"] = "y" * int(arguments["size"])
                blocks: list[types.ContentBlock] = (
                    []
                    if arguments.get("text") is False
                    else [text(type="text", text=json.dumps(structured))]
                )
                if arguments.get("image"):
                    data = base64.b64encode(PNG_BYTES).decode()
                    image = types.ImageContent(type="image", data=data, mime_type="image/png")
                    blocks = [*blocks, image]
                return types.CallToolResult(content=blocks, structured_content=structured)
            case "wrong_structured":
                return types.CallToolResult(
                    content=[text(type="text", text='{"y": 1}')], structured_content={"y": 1}
                )
            case "missing_structured":
                return types.CallToolResult(content=[text(type="text", text="no structure")])
            case "remote_ref_output":
                return types.CallToolResult(
                    content=[text(type="text", text='{"y": "z"}')], structured_content={"y": "z"}
                )
            case "repair_listing":
                faults.repaired = True
                await announce(ctx)
                return types.CallToolResult(content=[text(type="text", text="repaired")])
            case "fail":
                raise RuntimeError("the fixture tool failed on purpose")
            case "tool_error":
                return types.CallToolResult(
                    content=[text(type="text", text="bad input: value must be positive")],
                    is_error=True,
                )
            case "hang":
                await anyio.sleep_forever()
                raise AssertionError("unreachable")
            case "exit":
                os._exit(3)
            case name if name in added or name.startswith("bulk_") or name == BAD_SCHEMA_TOOL:
                return types.CallToolResult(content=[text(type="text", text=f"{name} ran")])
        return types.CallToolResult(
            content=[text(type="text", text=f"unknown tool {params.name}")], is_error=True
        )

    server = Server(
        "psych-fixture",
        version="1.0.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_subscriptions_listen=ListenHandler(bus) if listen else None,
    )
    if jobs is not None:
        jobs.install(server)
    return server


async def serve_stdio(server: Server[Any], era: str, listing: Listing) -> None:
    options = server.create_initialization_options(NotificationOptions(tools_changed=True))
    async with stdio_server() as (read_stream, stdout_stream):
        write_stream = BreakingWriter(stdout_stream, listing)
        if era == "auto":
            await server.run(read_stream, write_stream, options)
            return
        # Handshake only, like the TypeScript SDK's servers: server/discover is refused.
        async with server.lifespan(server) as state:
            await serve_loop(
                server, read_stream, write_stream, lifespan_state=state, init_options=options
            )


def requiring_header(app: Any, header: str) -> Any:
    """`app` answering 401 to an HTTP request without the header `NAME=VALUE`, as a server
    behind a bearer token does."""
    name, _, value = header.partition("=")
    wanted = (name.strip().lower().encode(), value.strip().encode())

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and wanted not in scope["headers"]:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return guarded


def requiring_standard_headers(app: Any) -> Any:
    """`app` refusing a 2026-07-28 request (one whose `_meta` names its protocol version)
    without the standard headers: `Mcp-Method` on every one, and `Mcp-Name` (its Base64 form
    decoded) equal to `params.name` on tools/call, with 400 and the spec's HeaderMismatch error,
    before the SDK's own checks see it."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
        if problem := _standard_header_problem(request, headers):
            error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32020, "message": problem}}
            if isinstance(request, dict):
                error["id"] = request.get("id")
            payload = json.dumps(error).encode()
            start = {
                "type": "http.response.start",
                "status": 400,
                "headers": [(b"content-type", b"application/json")],
            }
            await send(start)
            await send({"type": "http.response.body", "body": payload})
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, replay, send)

    return guarded


def _standard_header_problem(request: Any, headers: dict[str, str]) -> str:
    if not isinstance(request, dict) or "method" not in request:
        return ""
    params = request.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or "io.modelcontextprotocol/protocolVersion" not in meta:
        return ""  # a 2025-11-25 request: no standard headers then
    if headers.get("mcp-method") != request["method"]:
        return f"Mcp-Method missing or not {request['method']!r}"
    if request["method"] == "tools/call" and isinstance(params, dict):
        sent = headers.get("mcp-name", "")
        if sent.startswith("=?base64?") and sent.endswith("?="):
            sent = base64.b64decode(sent[len("=?base64?") : -2]).decode()
        if sent != params.get("name"):
            return "Mcp-Name missing or not the tool's name"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tools", type=int, default=250)
    parser.add_argument("--page-size", type=int, default=50)
    parser.add_argument("--era", choices=["auto", "legacy"], default="auto")
    # A 2026-era server with no subscriptions/listen (it answers -32601, as many do).
    parser.add_argument("--no-listen", action="store_true")
    parser.add_argument("--require-header", metavar="NAME=VALUE", help="401 without it (http)")
    parser.add_argument("--invalid-tools", choices=["one", "all"], default="")
    parser.add_argument("--output-schema-faults", action="store_true")
    parser.add_argument("--data-tools", action="store_true")
    parser.add_argument("--list-ttl-ms", type=int, default=None, help="tools/list's ttlMs")
    parser.add_argument("--tasks", action="store_true", help="task_server.py's tools and tasks")
    parser.add_argument(
        "--client-duty-tools",
        action="store_true",
        help="list ODD_NAME_TOOL and OPTIONAL_FLAG_TOOL too",
    )
    parser.add_argument(
        "--require-standard-headers",
        action="store_true",
        help="400 for a 2026 request without Mcp-Method / Mcp-Name (http)",
    )
    parser.add_argument("--asking-tools", action="store_true")
    options = parser.parse_args()
    listing = Listing(
        options.invalid_tools,
        options.output_schema_faults,
        options.data_tools,
        ttl_ms=options.list_ttl_ms,
        client_duty_tools=options.client_duty_tools,
        asking_tools=options.asking_tools,
    )
    server = build_server(
        options.tools,
        options.page_size,
        listen=not options.no_listen,
        listing_faults=listing,
        jobs=TaskJobs() if options.tasks else None,
    )
    if options.transport == "stdio":
        anyio.run(serve_stdio, server, options.era, listing)
        return
    if options.era != "auto" or options.invalid_tools:
        parser.error("--era legacy and --invalid-tools are for stdio")
    app = server.streamable_http_app()
    if options.require_header:
        app = requiring_header(app, options.require_header)
    if options.require_standard_headers:
        app = requiring_standard_headers(app)
    config = uvicorn.Config(app, host="127.0.0.1", port=options.port, log_level="warning")
    print(f"listening on {options.port}", file=sys.stderr, flush=True)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()

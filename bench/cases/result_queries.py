"""Data tasks over large JSON results, billed three ways: the reader as it was (offset and grep
only), queries and references, and a host that sends results in full capped at 25,000 tokens.

The trace is generated from a seed by a real MCP server: the project's fixture server with
`--data-tools` (its `listing` tool returns seeded tickets, users or orders as JSON, one record
per line; `take_ids` consumes a list of ids). One sidecar process on SQLite runs every Run; a
scripted model makes the calls each host allows:

- find: the ids of the tickets open, assigned to Ana and tagged security, in a 20 MB listing
  (`--quick`: 2 MB);
- join: the total amount of paid orders placed by users in Norway (users 2,000, orders 30,000);
- hand-off: every pending ticket's id passed to `take_ids` (8,000 tickets).

Billing: each model call's Anthropic request body, bytes / 4, summed; no prompt cache for any
host (every request billed whole). The sidecar hosts' bodies are the sidecar's own
(AssemblePrompt on the Run's real log; both Specs cap a current-turn result at 8,000 tokens,
so a listing arrives as a preview with its handle, and the reader pages by 30,000 characters
to stay under it); the capped
host's are the first request's tools and system prompt plus every message as JSON, each
result cut at 100,000 bytes (25,000 tokens) with a note. Every answer is checked against the
data read back from the log.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc.aio

from bench._proc import REPO_ROOT, sidecar
from bench.registry import BenchContext, case
from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    connection_service_pb2_grpc,
    content_pb2,
    run_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    spec_service_pb2,
    spec_service_pb2_grpc,
    tool_service_pb2,
    tool_service_pb2_grpc,
    turn_service_pb2,
    turn_service_pb2_grpc,
)

FIXTURE_SERVER = REPO_ROOT / "tests" / "mcp_servers" / "fixture_server.py"
MIB = 1024 * 1024
MESSAGE_BYTES = 256 * MIB
TENANT = "bench"
SEED = 7
CAP_BYTES = 100_000  # 25,000 tokens at 4 bytes a token
# Both sidecar hosts cap a current-turn result at this many tokens (the Spec's optional
# `current_turn_result_tokens`): a larger one is sent as a preview with its handle, as a
# prior turn's is. Without it a 2 MB listing would enter the prompt whole until the context
# guard steps in.
RESULT_CAP_TOKENS = 8_000
PAGE = 30_000  # the reader's grep page: under the cap, so each page is seen whole
FIND_QUERY = "items[?status=='open' && assignee=='Ana' && contains(tags, 'security')].id"
FIND_GREP = r'"status":"open","assignee":"Ana",.*"security"'
HANDOFF_QUERY = "items[?status=='pending'].id"
HANDOFF_GREP = r'"status":"pending"'


@dataclass
class Host:
    """One host's bill: model calls and the tokens of their requests."""

    requests: int = 0
    tokens: int = 0
    correct: dict[str, bool] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def bill(self, body_bytes: int) -> None:
        self.requests += 1
        self.tokens += body_bytes // 4


class Stubs:
    def __init__(self, ch: grpc.aio.Channel) -> None:
        self.runs = run_service_pb2_grpc.RunServiceStub(ch)
        self.turns = turn_service_pb2_grpc.TurnServiceStub(ch)
        self.tools = tool_service_pb2_grpc.ToolServiceStub(ch)
        self.specs = spec_service_pb2_grpc.SpecServiceStub(ch)
        self.connections = connection_service_pb2_grpc.ConnectionServiceStub(ch)


class SidecarRun:
    """A Run driven as a host on the sidecar does: append the model's calls, dispatch them,
    assemble each request the model reads."""

    def __init__(self, stubs: Stubs, run_id: str, host: Host) -> None:
        self.stubs, self.run_id, self.host = stubs, run_id, host
        self.calls = 0
        self.first_body = b""

    async def append(self, *records: run_pb2.Record) -> None:
        await self.stubs.runs.AppendRecords(
            run_service_pb2.AppendRecordsRequest(run_id=self.run_id, records=list(records)),
            timeout=600,
        )

    async def user(self, text: str) -> None:
        await self.append(_user(text))

    async def model_reads(self) -> None:
        body = (
            await self.stubs.turns.AssemblePrompt(
                turn_service_pb2.AssemblePromptRequest(run_id=self.run_id, model="claude-bench"),
                timeout=600,
            )
        ).anthropic_request_json
        self.first_body = self.first_body or body
        self.host.bill(len(body))

    async def tool(self, name: str, arguments: dict[str, Any]) -> tool_service_pb2.ToolOutcome:
        self.calls += 1
        call = content_pb2.ToolCall(
            call_id=f"c{self.calls}", name=name, arguments_json=json.dumps(arguments)
        )
        await self.append(
            run_pb2.Record(assistant_message=run_pb2.AssistantMessage(tool_calls=[call]))
        )
        response = await self.stubs.tools.DispatchToolCall(
            tool_service_pb2.DispatchToolCallRequest(run_id=self.run_id, call=call), timeout=600
        )
        return response.outcome

    async def answer(self, text: str) -> None:
        await self.append(
            run_pb2.Record(
                assistant_message=run_pb2.AssistantMessage(
                    content=[content_pb2.ContentPart(text=text)]
                )
            )
        )


class CappedHost:
    """A host that sends every result in full, cut at 25,000 tokens: its requests' bytes."""

    def __init__(self, host: Host, base_bytes: int) -> None:
        self.host = host
        self.messages_bytes = base_bytes
        self.calls = 0

    def model_reads(self) -> None:
        self.host.bill(self.messages_bytes)

    def tool(self, name: str, arguments: dict[str, Any], result: str) -> str:
        """What the model sees of `result`."""
        self.calls += 1
        use = {"type": "tool_use", "id": f"c{self.calls}", "name": name, "input": arguments}
        seen = result
        if len(result.encode()) > CAP_BYTES:
            seen = result.encode()[:CAP_BYTES].decode(errors="ignore")
            seen += f"\n[Result truncated: {len(result)} characters, the first {len(seen)} shown.]"
        tool_result = {
            "type": "tool_result",
            "tool_use_id": f"c{self.calls}",
            "content": [{"type": "text", "text": seen}],
        }
        self.messages_bytes += len(json.dumps({"role": "assistant", "content": [use]}))
        self.messages_bytes += len(json.dumps({"role": "user", "content": [tool_result]}))
        return seen


def _user(text: str) -> run_pb2.Record:
    return run_pb2.Record(
        user_message=run_pb2.UserMessage(content=[content_pb2.ContentPart(text=text)])
    )


def _result_text(outcome: tool_service_pb2.ToolOutcome) -> str:
    result = json.loads(outcome.result_json)
    if outcome.is_error:
        raise AssertionError(f"a tool call failed: {result}")
    return "".join(block.get("text", "") for block in result["content"])


def _records(lines: list[str]) -> list[dict[str, Any]]:
    """The whole records among JSON lines (a cut listing's last line is not one)."""
    found = []
    for line in lines:
        line = line.strip().rstrip(",")
        if line.startswith("{") and line.endswith("}"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


async def _stored(stubs: Stubs, run_id: str, handle: str) -> Any:
    """The result's data, read back from the log in full."""
    read = await stubs.tools.ReadToolOutput(
        tool_service_pb2.ReadToolOutputRequest(run_id=run_id, handle=handle), timeout=600
    )
    assert read.next_offset == read.total_length
    return json.loads(read.text)


async def _query(
    run: SidecarRun, handle: str, query: str, timing: dict[str, Any] | None = None
) -> Any:
    await run.model_reads()
    start = time.perf_counter()
    outcome = await run.tool("read_tool_output", {"handle": handle, "query": query})
    if timing is not None:
        # The result's first query: its JSON read from the log and parsed, then evaluated.
        timing["first_query_ms"] = round((time.perf_counter() - start) * 1000, 1)
    return json.loads(_result_text(outcome))


async def _grep_pages(run: SidecarRun, handle: str, pattern: str) -> list[str]:
    """The reader as it was: grep pages of at most 32,000 characters, each a model call."""
    lines: list[str] = []
    offset = 0
    while True:
        await run.model_reads()
        arguments = {"handle": handle, "grep": pattern, "limit": PAGE, "offset": offset}
        text = _result_text(await run.tool("read_tool_output", arguments))
        lines += [m.group(1) for m in re.finditer(r"^\d+: (.*)$", text, re.M)]
        more = re.search(r"continue with offset (\d+)", text)
        if more is None:
            return lines
        offset = int(more.group(1))


@dataclass
class Sizes:
    tickets: int
    users: int
    orders: int
    handoff_tickets: int
    rounds: int


async def _setup(stubs: Stubs) -> None:
    await stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(
            connection=connection_pb2.Connection(
                tenant=TENANT,
                name="data",
                preload=True,
                stdio=connection_pb2.StdioTransport(
                    command="fixture", args=["--tools", "0", "--data-tools"]
                ),
            )
        ),
        timeout=60,
    )
    for _ in range(600):
        listed = await stubs.connections.ListConnections(
            connection_service_pb2.ListConnectionsRequest(tenant=TENANT)
        )
        if listed.connections and listed.connections[0].catalog_version:
            break
        await asyncio.sleep(0.1)
    else:
        raise RuntimeError("the fixture server was never listed")
    grants = [spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")]
    for name, references in (("queries", True), ("reader", False)):
        await stubs.specs.PublishSpec(
            spec_service_pb2.PublishSpecRequest(
                spec=spec_pb2.Spec(
                    name=name,
                    version=1,
                    instructions="Answer questions about the data the tools return.",
                    grants=grants,
                    disclosure=spec_pb2.DisclosureSettings(result_references=references),
                    context_budget=spec_pb2.ContextBudget(
                        current_turn_result_tokens=RESULT_CAP_TOKENS
                    ),
                )
            ),
            timeout=60,
        )


async def _run(stubs: Stubs, spec: str, host: Host) -> SidecarRun:
    run_id = (
        await stubs.runs.CreateRun(
            run_service_pb2.CreateRunRequest(tenant=TENANT, spec_name=spec, spec_version=1),
            timeout=60,
        )
    ).run.run_id
    return SidecarRun(stubs, run_id, host)


async def _find(stubs: Stubs, sizes: Sizes, hosts: dict[str, Host], timing: dict[str, Any]) -> None:
    question = "Which tickets are open, assigned to Ana and tagged security? Their ids."
    listing = {"kind": "tickets", "count": sizes.tickets, "seed": SEED}
    runs = {name: await _run(stubs, name, hosts[name]) for name in ("queries", "reader")}
    handles = {}
    for name, run in runs.items():
        await run.user(question)
        await run.model_reads()
        handles[name] = (await run.tool("data__listing", listing)).handle
    data = await _stored(stubs, runs["queries"].run_id, handles["queries"])
    truth = [
        t["id"]
        for t in data["items"]
        if t["status"] == "open" and t["assignee"] == "Ana" and "security" in t["tags"]
    ]
    timing["find_listing_bytes"] = len(json.dumps(data, separators=(",", ":")))
    timing["find_matches"] = len(truth)

    queried = await _query(runs["queries"], handles["queries"], FIND_QUERY, timing)
    await runs["queries"].model_reads()
    hosts["queries"].correct["find"] = queried == truth

    grepped = [
        r["id"] for r in _records(await _grep_pages(runs["reader"], handles["reader"], FIND_GREP))
    ]
    await runs["reader"].model_reads()
    hosts["reader"].correct["find"] = grepped == truth

    capped = CappedHost(hosts["capped"], len(runs["queries"].first_body))
    capped.model_reads()
    seen = capped.tool("data__listing", listing, _listing_text(data))
    capped.model_reads()
    found = [
        t["id"]
        for t in _records(seen.splitlines())
        if t["status"] == "open" and t["assignee"] == "Ana" and "security" in t["tags"]
    ]
    hosts["capped"].correct["find"] = found == truth
    hosts["capped"].notes["find_found"] = f"{len(found)} of {len(truth)}"

    # The query's time on this result against grep's, both one ReadToolOutput call.
    run_id, handle = runs["queries"].run_id, handles["queries"]
    query_s, grep_s = [], []
    for _ in range(sizes.rounds):
        start = time.perf_counter()
        await stubs.tools.ReadToolOutput(
            tool_service_pb2.ReadToolOutputRequest(run_id=run_id, handle=handle, query=FIND_QUERY),
            timeout=600,
        )
        query_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        page = await stubs.tools.ReadToolOutput(
            tool_service_pb2.ReadToolOutputRequest(run_id=run_id, handle=handle, grep=FIND_GREP),
            timeout=600,
        )
        grep_s.append(time.perf_counter() - start)
        assert page.next_offset == page.total_length, "one grep page holds every match"
    timing["query_p50_ms"] = round(statistics.median(query_s) * 1000, 1)
    timing["grep_p50_ms"] = round(statistics.median(grep_s) * 1000, 1)


def _listing_text(data: Any) -> str:
    lines = ",\n".join(json.dumps(r, separators=(",", ":")) for r in data["items"])
    return '{"items":[\n' + lines + "\n]}"


async def _join(stubs: Stubs, sizes: Sizes, hosts: dict[str, Host]) -> None:
    question = "What is the total amount of the paid orders of users in Norway (NO)?"
    users = {"kind": "users", "count": sizes.users, "seed": SEED}
    orders = {"kind": "orders", "count": sizes.orders, "seed": SEED, "users": sizes.users}
    runs = {name: await _run(stubs, name, hosts[name]) for name in ("queries", "reader")}
    handles: dict[str, tuple[str, str]] = {}
    for name, run in runs.items():
        await run.user(question)
        await run.model_reads()
        first = (await run.tool("data__listing", users)).handle
        await run.model_reads()
        handles[name] = (first, (await run.tool("data__listing", orders)).handle)
    run_id = runs["queries"].run_id
    user_data = await _stored(stubs, run_id, handles["queries"][0])
    order_data = await _stored(stubs, run_id, handles["queries"][1])
    norway = {u["id"] for u in user_data["items"] if u["country"] == "NO"}
    truth = sum(
        o["amount"] for o in order_data["items"] if o["status"] == "paid" and o["user_id"] in norway
    )

    run = runs["queries"]
    ids = await _query(run, handles["queries"][0], "items[?country=='NO'].id")
    literal = json.dumps(ids, separators=(",", ":"))
    total = await _query(
        run,
        handles["queries"][1],
        f"sum(items[?status=='paid' && contains(`{literal}`, user_id)].amount)",
    )
    await run.model_reads()
    hosts["queries"].correct["join"] = total == truth

    run = runs["reader"]
    found_users = _records(await _grep_pages(run, handles["reader"][0], r'"country":"NO"'))
    pattern = '"user_id":"(' + "|".join(u["id"] for u in found_users) + ')","status":"paid"'
    paid = _records(await _grep_pages(run, handles["reader"][1], pattern))
    await run.model_reads()
    hosts["reader"].correct["join"] = sum(o["amount"] for o in paid) == truth

    capped = CappedHost(hosts["capped"], len(runs["queries"].first_body))
    capped.model_reads()
    seen_users = _records(
        capped.tool("data__listing", users, _listing_text(user_data)).splitlines()
    )
    capped.model_reads()
    seen_orders = _records(
        capped.tool("data__listing", orders, _listing_text(order_data)).splitlines()
    )
    capped.model_reads()
    seen_norway = {u["id"] for u in seen_users if u["country"] == "NO"}
    capped_total = sum(
        o["amount"] for o in seen_orders if o["status"] == "paid" and o["user_id"] in seen_norway
    )
    hosts["capped"].correct["join"] = capped_total == truth
    hosts["capped"].notes["join_total"] = f"{capped_total} of {truth}"


async def _handoff(stubs: Stubs, sizes: Sizes, hosts: dict[str, Host]) -> None:
    question = "Send the ids of every pending ticket to take_ids."
    listing = {"kind": "tickets", "count": sizes.handoff_tickets, "seed": SEED + 1}
    runs = {name: await _run(stubs, name, hosts[name]) for name in ("queries", "reader")}
    handles = {}
    for name, run in runs.items():
        await run.user(question)
        await run.model_reads()
        handles[name] = (await run.tool("data__listing", listing)).handle
    data = await _stored(stubs, runs["queries"].run_id, handles["queries"])
    truth = [t["id"] for t in data["items"] if t["status"] == "pending"]
    expected = {
        "received": len(truth),
        "sha256": hashlib.sha256(",".join(truth).encode()).hexdigest(),
    }

    run = runs["queries"]
    await run.model_reads()
    reference = {"$ref_output": {"handle": handles["queries"], "query": HANDOFF_QUERY}}
    got = json.loads(_result_text(await run.tool("data__take_ids", {"ids": reference})))
    await run.model_reads()
    hosts["queries"].correct["handoff"] = got == expected

    run = runs["reader"]
    ids = [r["id"] for r in _records(await _grep_pages(run, handles["reader"], HANDOFF_GREP))]
    await run.model_reads()
    got = json.loads(_result_text(await run.tool("data__take_ids", {"ids": ids})))
    await run.model_reads()
    hosts["reader"].correct["handoff"] = got == expected

    capped = CappedHost(hosts["capped"], len(runs["queries"].first_body))
    capped.model_reads()
    seen = _records(capped.tool("data__listing", listing, _listing_text(data)).splitlines())
    capped.model_reads()
    sent = [t["id"] for t in seen if t["status"] == "pending"]
    digest = hashlib.sha256(",".join(sent).encode()).hexdigest()
    capped.tool("data__take_ids", {"ids": sent}, json.dumps({"received": len(sent)}))
    capped.model_reads()
    hosts["capped"].correct["handoff"] = {"received": len(sent), "sha256": digest} == expected
    hosts["capped"].notes["handoff_sent"] = f"{len(sent)} of {len(truth)}"


_RESULTS: dict[bool, dict[str, Any]] = {}


async def _replay(ctx: BenchContext) -> dict[str, Any]:
    """The three tasks, once per process and size (the cases share one replay)."""
    if ctx.quick in _RESULTS:
        return _RESULTS[ctx.quick]
    sizes = Sizes(
        tickets=ctx.pick(full=120_000, quick=12_000),
        users=ctx.pick(full=2_000, quick=600),
        orders=ctx.pick(full=30_000, quick=4_000),
        handoff_tickets=ctx.pick(full=8_000, quick=1_500),
        rounds=ctx.pick(full=7, quick=3),
    )
    config = ctx.tmp_dir / "data.toml"
    config.write_text(
        "[mcp_commands.fixture]\n"
        f"argv = {json.dumps([sys.executable, str(FIXTURE_SERVER), 'stdio'])}\n"
        "allow_extra_args = true\n"
    )
    args = [
        "--config",
        str(config),
        "--max-message-bytes",
        str(MESSAGE_BYTES),
        "--semantic-search",
        "off",
    ]
    options = [
        ("grpc.max_receive_message_length", MESSAGE_BYTES),
        ("grpc.max_send_message_length", MESSAGE_BYTES),
    ]
    hosts = {name: Host() for name in ("queries", "reader", "capped")}
    timing: dict[str, Any] = {}
    async with (
        sidecar(Path(ctx.tmp_dir), extra_args=args) as server,
        grpc.aio.insecure_channel(server.target, options=options) as ch,
    ):
        stubs = Stubs(ch)
        await _setup(stubs)
        ctx.log("find")
        await _find(stubs, sizes, hosts, timing)
        ctx.log("join")
        await _join(stubs, sizes, hosts)
        ctx.log("hand-off")
        await _handoff(stubs, sizes, hosts)
    for name in ("queries", "reader"):
        wrong = [task for task, ok in hosts[name].correct.items() if not ok]
        if wrong:
            raise AssertionError(f"the {name} host answered wrong: {wrong}")
    result = {
        "sizes": sizes.__dict__,
        "hosts": {
            name: {
                "requests": h.requests,
                "billed_input_tokens": h.tokens,
                "correct": h.correct,
                **h.notes,
            }
            for name, h in hosts.items()
        },
        **timing,
    }
    _RESULTS[ctx.quick] = result
    return result


@case("billed_input_ratio_queries_vs_reader", unit="ratio", target=">= 3")
async def billed_input_ratio_queries_vs_reader(ctx: BenchContext) -> float:
    """Data tasks (find in a 20 MB JSON listing, join two listings, hand a listing to another
    tool; fixture MCP server with seeded data, `bench/cases/result_queries.py`): the billed
    input of the reader as it was (grep and offset pages, the model copying ids into
    arguments) over the same tasks with queries and `$ref_output` references. Request bodies
    are the sidecar's own (AssemblePrompt; both sidecar Specs cap a current-turn result at 8,000
    tokens, the reader's pages are 30,000 characters), bytes / 4, no cache simulated; every answer
    checked against the data. `--quick`: a 2 MB listing, smaller joins and hand-off."""
    result = await _replay(ctx)
    ctx.details.update(result)
    hosts = result["hosts"]
    return float(hosts["reader"]["billed_input_tokens"] / hosts["queries"]["billed_input_tokens"])


@case("billed_input_ratio_queries_vs_capped_host", unit="ratio", target=">= 5")
async def billed_input_ratio_queries_vs_capped_host(ctx: BenchContext) -> float:
    """The same data tasks: a host sending every result in full, cut at 25,000 tokens (what
    is cut is lost), over the sidecar with queries and references; the details say which of
    its answers were wrong and how much it saw."""
    result = await _replay(ctx)
    ctx.details.update(result)
    hosts = result["hosts"]
    return float(hosts["capped"]["billed_input_tokens"] / hosts["queries"]["billed_input_tokens"])


@case("query_over_grep_time_20mb", unit="ratio", target="<= 1")
async def query_over_grep_time_20mb(ctx: BenchContext) -> float:
    """The find task's JMESPath query over the stored 20 MB listing (`--quick`: 2 MB), p50 of
    ReadToolOutput calls, over the p50 of a ReadToolOutput grep for the same records (one
    call, every match in one page) on the same result; both measured at the client. The model
    queried the result once before (the find task's answer), so the sidecar has it parsed:
    `first_query_ms` in the details is that first query (a DispatchToolCall of
    read_tool_output, reading and parsing the JSON)."""
    result = await _replay(ctx)
    ctx.details.update(
        {
            k: result[k]
            for k in ("query_p50_ms", "grep_p50_ms", "first_query_ms", "find_listing_bytes")
        }
    )
    return float(result["query_p50_ms"]) / float(result["grep_p50_ms"])

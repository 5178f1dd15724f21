"""What one tool call costs: the sidecar's calls/s against the MCP SDK client calling the same
MCP server directly and against a bare gRPC-to-MCP relay (tool_call_overhead_ratio), and the
bytes a result takes on disk (stored_bytes_per_result_byte)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from itertools import count
from pathlib import Path
from typing import Any

import grpc.aio
from google.protobuf import struct_pb2
from mcp import Client

from bench._load import drive, median
from bench._mcp_relay import CALL_TOOL_METHOD
from bench._proc import (
    PROBE_CHANNEL_OPTIONS,
    REPO_ROOT,
    Server,
    channel,
    free_port,
    managed,
    sidecar,
    wait_until,
)
from bench.registry import BenchContext, case
from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    connection_service_pb2_grpc,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    spec_service_pb2,
    spec_service_pb2_grpc,
    tool_service_pb2,
    tool_service_pb2_grpc,
)

FIXTURE_SERVER = REPO_ROOT / "tests" / "mcp_servers" / "fixture_server.py"
TENANT = "bench"
SERVER = "fx"
KIB = 1024
LARGE_RESULT_CHARS = 256 * KIB
SMALL_ARGUMENTS = {"text": "hello"}
LARGE_ARGUMENTS = {"size": LARGE_RESULT_CHARS}

Call = Callable[[], Awaitable[object]]


@contextlib.asynccontextmanager
async def _mcp_server(tmp_dir: Path) -> AsyncIterator[tuple[str, Server]]:
    """The project's fixture MCP server over streamable HTTP, and its URL."""
    port = free_port()
    argv = [sys.executable, str(FIXTURE_SERVER), "http", "--port", str(port), "--tools", "0"]
    with managed("mcp", argv, tmp_dir / "mcp.log") as proc:

        async def listening() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True

        waited = await wait_until(proc, listening, within=60, what="listening")
        yield f"http://127.0.0.1:{port}/mcp", Server(f"127.0.0.1:{port}", proc, waited)
        proc.check_alive()


@contextlib.asynccontextmanager
async def _mcp_relay(tmp_dir: Path, url: str) -> AsyncIterator[Server]:
    """The bare gRPC-to-MCP relay (bench._mcp_relay) in front of the MCP server at `url`, once
    it has relayed a call."""
    port = free_port()
    target = f"127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench._mcp_relay", "--listen", target, "--url", url]
    with managed("relay", argv, tmp_dir / "relay.log") as proc:
        # It listens only once its MCP session is open: a short reconnect backoff keeps the
        # wait from timing gRPC's default one (1 s, then 1.6 s...).
        async with grpc.aio.insecure_channel(target, options=PROBE_CHANNEL_OPTIONS) as ch:
            relay = _RelayCalls(ch)

            async def relaying() -> bool:
                await relay.call("echo", SMALL_ARGUMENTS)
                return True

            waited = await wait_until(proc, relaying, within=60, what="relaying")
        yield Server(target, proc, waited)
        proc.check_alive()


class _RelayCalls:
    """Tool calls through the relay: the call as JSON bytes, the result's JSON back."""

    def __init__(self, ch: grpc.aio.Channel) -> None:
        self._call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(
            CALL_TOOL_METHOD
        )

    async def call(self, tool: str, arguments: dict[str, Any]) -> bytes:
        request = json.dumps({"tool": tool, "arguments": arguments}).encode()
        result = await self._call(request, timeout=60)
        # JSON escapes the quotes of a string, so this key appears only as a key; a search, not a
        # parse, as the sidecar's client reads its `is_error` field without parsing the result.
        if b'"isError":true' in result:
            raise AssertionError(f"the tool call failed: {result[:300]!r}")
        return result


class _SidecarCalls:
    """CallDeferredTool on one Run of a sidecar connected to the MCP server, one call id per
    call."""

    def __init__(self, ch: grpc.aio.Channel) -> None:
        self._ch = ch
        self._tools = tool_service_pb2_grpc.ToolServiceStub(ch)
        self._ids = count()
        self.run_id = ""

    async def connect(self, url: str) -> None:
        connections = connection_service_pb2_grpc.ConnectionServiceStub(self._ch)
        connection = connection_pb2.Connection(
            tenant=TENANT,
            name=SERVER,
            http=connection_pb2.HttpTransport(
                url=url, protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP
            ),
            preload=True,
        )
        await connections.PutConnection(
            connection_service_pb2.PutConnectionRequest(connection=connection), timeout=60
        )
        await spec_service_pb2_grpc.SpecServiceStub(self._ch).PublishSpec(
            spec_service_pb2.PublishSpecRequest(
                spec=spec_pb2.Spec(
                    name="calls",
                    version=1,
                    grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")],
                )
            ),
            timeout=60,
        )
        created = await run_service_pb2_grpc.RunServiceStub(self._ch).CreateRun(
            run_service_pb2.CreateRunRequest(tenant=TENANT, spec_name="calls", spec_version=1),
            timeout=60,
        )
        self.run_id = created.run.run_id
        # Until the server's catalogue is in: the first call that is not an error.
        for _ in range(600):
            if not (await self.call("echo", SMALL_ARGUMENTS)).is_error:
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("the MCP server's tools never became callable")

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        struct = struct_pb2.Struct()
        struct.update(arguments)
        request = tool_service_pb2.CallDeferredToolRequest(
            run_id=self.run_id,
            server=SERVER,
            tool=tool,
            arguments=struct,
            call_id=f"c{next(self._ids)}",
        )
        response = await self._tools.CallDeferredTool(request, timeout=60)
        return response.outcome


async def _abab(
    ctx: BenchContext,
    label: str,
    targets: dict[str, Call],
    *,
    calls: int,
    rounds: int,
    concurrency: int,
) -> dict[str, float]:
    """Median calls/s of each target over `rounds` rounds, the order rotated by one each round:
    with `rounds` a multiple of the number of targets, each target runs in each position
    equally often."""
    rates: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    for fn in targets.values():
        await drive(fn, calls=max(calls // 4, concurrency), concurrency=concurrency)
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            result = await drive(targets[name], calls=calls, concurrency=concurrency)
            rates[name].append(result.per_second)
        ctx.log(
            f"{label} round {index + 1}/{rounds}: "
            + ", ".join(f"{name} {rates[name][-1]:.0f}/s" for name in names)
        )
    ctx.details[f"{label}_rounds"] = {
        name: [round(rate, 1) for rate in values] for name, values in rates.items()
    }
    return {name: median(values) for name, values in rates.items()}


@case("tool_call_overhead_ratio", unit="ratio", target=">= 0.5")
async def tool_call_overhead_ratio(ctx: BenchContext) -> float:
    """CallDeferredTool calls/s through the sidecar divided by the MCP SDK client's calling
    the same streamable-HTTP MCP server directly: one caller, a small result (the fixture
    server's echo of 5 characters).

    One fixture MCP server process, one sidecar process on SQLite (tool search off) connected
    to it, one relay process (bench._mcp_relay: a bare grpc.aio server calling the tool through
    one MCP SDK `Client` session, nothing else) in front of it, and the benchmark process as
    the client of all three: gRPC channels to the sidecar and the relay, one MCP SDK `Client`
    session to the server. The relay is the floor of any gateway built on grpc.aio and the SDK:
    the extra process hop and the SDK client's work, none of the sidecar's. After a warm-up,
    rounds rotate the three targets' order (each takes each position equally often); the
    medians are compared. The details give the relay's calls/s, `relay_floor_ratio` (relay
    over direct: the best a gateway could score) and `sidecar_over_relay` (what the sidecar's
    own work costs), the same with eight callers and with one caller and a 256 KiB text
    result, and each target's calls/s per round.
    """
    calls = ctx.pick(full=400, quick=120)
    large_calls = ctx.pick(full=80, quick=30)
    rounds = ctx.pick(full=6, quick=3)
    async with contextlib.AsyncExitStack() as stack:
        url, _ = await stack.enter_async_context(_mcp_server(ctx.tmp_dir))
        server = await stack.enter_async_context(
            sidecar(ctx.tmp_dir, extra_args=["--semantic-search", "off"])
        )
        ch = await stack.enter_async_context(channel(server.target))
        through_sidecar = _SidecarCalls(ch)
        await through_sidecar.connect(url)
        relay_server = await stack.enter_async_context(_mcp_relay(ctx.tmp_dir, url))
        through_relay = _RelayCalls(await stack.enter_async_context(channel(relay_server.target)))
        direct = await stack.enter_async_context(Client(url))

        def targets(tool: str, arguments: dict[str, Any]) -> dict[str, Call]:
            return {
                "sidecar": lambda: _checked(through_sidecar.call(tool, arguments)),
                "relay": lambda: through_relay.call(tool, arguments),
                "direct": lambda: direct.call_tool(tool, arguments),
            }

        small = targets("echo", SMALL_ARGUMENTS)
        one = await _abab(ctx, "one_caller", small, calls=calls, rounds=rounds, concurrency=1)
        eight = await _abab(ctx, "eight_callers", small, calls=calls, rounds=rounds, concurrency=8)
        large = await _abab(
            ctx,
            "one_caller_256_kib",
            targets("huge_text", LARGE_ARGUMENTS),
            calls=large_calls,
            rounds=rounds,
            concurrency=1,
        )
    ratio = one["sidecar"] / one["direct"]
    ctx.details.update(
        {
            "sidecar_calls_per_s": round(one["sidecar"], 1),
            "relay_calls_per_s": round(one["relay"], 1),
            "direct_calls_per_s": round(one["direct"], 1),
            "relay_floor_ratio": round(one["relay"] / one["direct"], 4),
            "sidecar_over_relay": round(one["sidecar"] / one["relay"], 4),
            "eight_callers_ratio": round(eight["sidecar"] / eight["direct"], 4),
            "eight_callers_relay_floor_ratio": round(eight["relay"] / eight["direct"], 4),
            "eight_callers_sidecar_over_relay": round(eight["sidecar"] / eight["relay"], 4),
            "eight_callers_sidecar_calls_per_s": round(eight["sidecar"], 1),
            "eight_callers_relay_calls_per_s": round(eight["relay"], 1),
            "eight_callers_direct_calls_per_s": round(eight["direct"], 1),
            "ratio_256_kib": round(large["sidecar"] / large["direct"], 4),
            "relay_floor_ratio_256_kib": round(large["relay"] / large["direct"], 4),
            "sidecar_over_relay_256_kib": round(large["sidecar"] / large["relay"], 4),
            "sidecar_256_kib_calls_per_s": round(large["sidecar"], 1),
            "relay_256_kib_calls_per_s": round(large["relay"], 1),
            "direct_256_kib_calls_per_s": round(large["direct"], 1),
            "calls_per_round": calls,
            "calls_per_round_256_kib": large_calls,
        }
    )
    return ratio


async def _checked(outcome: Awaitable[Any]) -> Any:
    """A call the benchmark counts must have run the tool: an error would be a cheap call."""
    result = await outcome
    if result.is_error:
        raise AssertionError(f"the tool call failed: {result.result_json[:300]!r}")
    return result


def _stored_bytes(database: Path) -> int:
    """Bytes of the SQLite database's pages in use, its write-ahead log's included."""
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        free = connection.execute("PRAGMA freelist_count").fetchone()[0]
        size = connection.execute("PRAGMA page_size").fetchone()[0]
    finally:
        connection.close()
    return int((pages - free) * size)


@case("stored_bytes_per_result_byte", unit="ratio", target="<= 1.1")
async def stored_bytes_per_result_byte(ctx: BenchContext) -> float:
    """How much the database grows per byte of tool result: CallDeferredTool calls of a 256 KiB
    text result (the fixture MCP server over streamable HTTP), the SQLite database's pages in
    use after them less before, over the result JSON bytes the calls returned.

    A result is in the Run's log once, as its record's part; what answers a retried call keeps
    only a reference to it. The details give the bytes per call beyond the result's."""
    results = ctx.pick(full=60, quick=12)
    database = ctx.tmp_dir / "stored.sqlite3"
    async with contextlib.AsyncExitStack() as stack:
        url, _ = await stack.enter_async_context(_mcp_server(ctx.tmp_dir))
        server = await stack.enter_async_context(
            sidecar(
                ctx.tmp_dir,
                database_url=f"sqlite:///{database}",
                extra_args=["--semantic-search", "off"],
                name="stored",
            )
        )
        ch = await stack.enter_async_context(channel(server.target))
        calls = _SidecarCalls(ch)
        await calls.connect(url)
        before = _stored_bytes(database)
        result_bytes = 0
        for _ in range(results):
            outcome = await _checked(calls.call("huge_text", LARGE_ARGUMENTS))
            result_bytes += len(outcome.result_json)
        grown = _stored_bytes(database) - before
    ctx.details.update(
        {
            "results": results,
            "result_json_bytes": result_bytes // results,
            "stored_bytes_per_result": grown // results,
            "overhead_bytes_per_result": (grown - result_bytes) // results,
        }
    )
    return grown / result_bytes

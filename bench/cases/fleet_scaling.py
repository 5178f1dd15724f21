"""fleet_errors_8_sidecars: 1, 2, 4 and 8 sidecar processes on one PostgreSQL through PgBouncer
in transaction mode, clients spread over them, and what each call costs the database."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from google.protobuf import struct_pb2
from sqlalchemy import make_url

from bench._pgstats import (
    CpuMeter,
    DatabaseCounters,
    delta,
    pgbouncer_pid,
    postgres_cpu_seconds,
    process_cpu_seconds,
    sampled,
)
from bench._postgres import POSTGRES_URL_ENV, fresh_database
from bench._proc import REPO_ROOT, Server, channel, sidecar
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

PGBOUNCER_URL_ENV = "PSYCH_TEST_PGBOUNCER_URL"
FIXTURE_SERVER = REPO_ROOT / "tests" / "mcp_servers" / "fixture_server.py"
SIDECAR_COUNTS = (1, 2, 4, 8)
# --quick: the first and the last, for CI's quick run.
QUICK_SIDECAR_COUNTS = (1, 8)
# Calls in flight, the same whatever the number of sidecars taking them.
CONCURRENCY = 16
TENANT = "fleet"
SPEC = "fleet"
SERVER = "fx"
# A "1 MB" result: 1,000,000 characters of text.
LARGE_RESULT_CHARS = 1_000_000
LARGE_CONCURRENCY = 4
RETRIES = 5


@case("fleet_errors_8_sidecars", unit="errors", target="<= 0")
async def fleet_errors_8_sidecars(ctx: BenchContext) -> float:
    """1, 2, 4 and 8 `psych-sidecar serve` processes on one PostgreSQL through PgBouncer in
    transaction mode (`--database-pooling transaction`, migrations on PostgreSQL's own address),
    16 calls in flight spread over them; the value is the failed calls with 8 sidecars. For
    each count, one after another: single-record appends (records/s), small tool calls of the
    fixture MCP server (stdio, one per sidecar), tool calls of 1 MB results, AssemblePrompt on
    long Runs (2,001 records), and a mix of the three. Each measured from the server: statements
    (pg_stat_statements), transactions, WAL bytes (pg_current_wal_lsn), server connections and
    lock waits (pg_stat_activity and PgBouncer's SHOW POOLS, sampled every 0.1 s), and the CPU
    milliseconds per call of the client, the sidecars, their MCP servers, PostgreSQL and
    PgBouncer. Every acknowledged record must be stored exactly once."""
    bouncer = os.environ.get(PGBOUNCER_URL_ENV)
    if not bouncer:
        raise RuntimeError(
            f"{PGBOUNCER_URL_ENV} is not set: run under scripts/with-postgres with pgbouncer "
            "installed (scripts/with-pgbouncer)"
        )
    sizes = _Sizes(
        appends=ctx.pick(full=4000, quick=320),
        tool_calls=ctx.pick(full=2000, quick=160),
        large_calls=ctx.pick(full=16, quick=4),
        assembles=ctx.pick(full=20, quick=4),
        mixed_seconds=ctx.pick(full=15, quick=3),
        long_run_turns=ctx.pick(full=250, quick=25),
    )
    counts = QUICK_SIDECAR_COUNTS if ctx.quick else SIDECAR_COUNTS
    with fresh_database() as direct_url:
        name = make_url(direct_url).database
        assert name is not None
        bouncer_url = make_url(bouncer).set(database=name).render_as_string(False)
        counters = DatabaseCounters(os.environ[POSTGRES_URL_ENV], name, bouncer_url)
        fleet = _Fleet(ctx, direct_url, bouncer_url, counters)
        try:
            long_runs = await fleet.setup(sizes.long_run_turns)
            rows = {}
            for count in counts:
                rows[count] = await fleet.measure(count, sizes, long_runs)
                ctx.log(f"{count} sidecar(s): {_summary(rows[count])}")
        finally:
            counters.close()
    one = rows[1]["appends"]["records_per_s"]
    for row in rows.values():
        row["appends"]["vs_one_sidecar"] = round(row["appends"]["records_per_s"] / one, 2)
    ctx.details.update(
        {
            "statements_counted_by": "pg_stat_statements"
            if counters.statements_available
            else "PgBouncer SHOW STATS (total_query_count)",
            "sizes": asdict(sizes),
            "concurrency": CONCURRENCY,
            "by_sidecars": {str(count): rows[count] for count in counts},
            "table": [_table_row(count, rows[count]) for count in counts],
        }
    )
    return float(rows[counts[-1]]["errors"])


@dataclass(frozen=True, kw_only=True)
class _Sizes:
    appends: int
    tool_calls: int
    large_calls: int
    assembles: int
    mixed_seconds: int
    long_run_turns: int


def _summary(row: dict[str, Any]) -> str:
    appends, calls = row["appends"], row["tool_calls"]
    return (
        f"{appends['records_per_s']:.0f} records/s, {calls['calls_per_s']:.0f} tool calls/s, "
        f"{appends['per_record'].get('statements', '?')} statements/append, "
        f"{calls['per_call'].get('statements', '?')} statements/tool call, "
        f"{row['server_connections_max']} server connections, {row['errors']} errors"
    )


def _table_row(count: int, row: dict[str, Any]) -> dict[str, Any]:
    appends, calls, large = row["appends"], row["tool_calls"], row["large_results"]
    return {
        "sidecars": count,
        "records_per_s": appends["records_per_s"],
        "vs_one": appends["vs_one_sidecar"],
        "tool_calls_per_s": calls["calls_per_s"],
        "assemble_p50_ms": row["mixed"]["latency_ms"].get("AssemblePrompt", {}).get("p50"),
        "server_connections_max": row["server_connections_max"],
        "pgbouncer_clients_max": row["pgbouncer_clients_max"],
        "statements_per_append": appends["per_record"].get("statements"),
        "statements_per_tool_call": calls["per_call"].get("statements"),
        "wal_bytes_per_append": appends["per_record"]["wal_bytes"],
        "wal_bytes_per_tool_call": calls["per_call"]["wal_bytes"],
        "wal_bytes_per_1mb_result": large["per_call"]["wal_bytes"],
        "statements_per_assemble": row["assemble"]["per_call"].get("statements"),
        "assemble_alone_p50_ms": row["assemble"]["p50_ms"],
        "lock_waiting_samples": row["lock_waiting_samples"],
        "errors": row["errors"],
    }


class _Fleet:
    """The database, the sidecars of one count at a time, and the measurements."""

    def __init__(
        self, ctx: BenchContext, direct_url: str, bouncer_url: str, counters: DatabaseCounters
    ) -> None:
        self.ctx = ctx
        self.direct_url = direct_url
        self.bouncer_url = bouncer_url
        self.counters = counters
        self.config = ctx.tmp_dir / "fleet.toml"
        self.config.write_text(
            "[mcp_commands.fixture]\n"
            f"argv = {json.dumps([sys.executable, str(FIXTURE_SERVER), 'stdio'])}\n"
            "allow_extra_args = true\n"
        )
        self._started = itertools.count()
        self._ids = itertools.count()

    def _sidecar(self) -> contextlib.AbstractAsyncContextManager[Server]:
        return sidecar(
            self.ctx.tmp_dir,
            database_url=self.bouncer_url,
            name=f"sidecar-{next(self._started)}",
            extra_args=[
                "--config",
                str(self.config),
                "--database-pooling",
                "transaction",
                "--migration-database-url",
                self.direct_url,
                "--semantic-search",
                "off",
            ],
        )

    async def setup(self, turns: int) -> list[str]:
        """The tenant's connection to the fixture server, the Spec, and two long Runs (`turns`
        turns of 8 records) for AssemblePrompt."""
        async with self._sidecar() as server, channel(server.target) as ch:
            await connection_service_pb2_grpc.ConnectionServiceStub(ch).PutConnection(
                connection_service_pb2.PutConnectionRequest(
                    connection=connection_pb2.Connection(
                        tenant=TENANT,
                        name=SERVER,
                        stdio=connection_pb2.StdioTransport(
                            command="fixture", args=["--tools", "0"]
                        ),
                    )
                ),
                timeout=60,
            )
            await spec_service_pb2_grpc.SpecServiceStub(ch).PublishSpec(
                spec_service_pb2.PublishSpecRequest(
                    spec=spec_pb2.Spec(
                        name=SPEC,
                        version=1,
                        instructions="You run a fleet.",
                        grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")],
                    )
                ),
                timeout=60,
            )
            runs = run_service_pb2_grpc.RunServiceStub(ch)
            long_runs = await _create_runs(runs, 2)
            for run_id in long_runs:
                await _fill(runs, run_id, turns)
        return long_runs

    async def measure(self, count: int, sizes: _Sizes, long_runs: list[str]) -> dict[str, Any]:
        async with contextlib.AsyncExitStack() as stack:
            servers = await asyncio.gather(
                *(stack.enter_async_context(self._sidecar()) for _ in range(count))
            )
            channels = [await stack.enter_async_context(channel(s.target)) for s in servers]
            pids = [s.process.pid for s in servers]
            meter = CpuMeter(
                {
                    "client": lambda: process_cpu_seconds(os.getpid()),
                    "sidecars": lambda: sum(process_cpu_seconds(p, children=True) for p in pids),
                    "mcp_servers": lambda: sum(
                        process_cpu_seconds(child) for p in pids for child in _children_of(p)
                    ),
                    "postgres": lambda: postgres_cpu_seconds(
                        os.environ.get("PSYCH_TEST_POSTGRES_DATA")
                    ),
                    "pgbouncer": lambda: _pgbouncer_cpu(self.bouncer_url),
                }
            )
            load = _Load(self, channels)
            await load.ready()
            row: dict[str, Any] = {"errors": 0}
            samples_all = []
            phases: list[tuple[str, Callable[[], Awaitable[tuple[int, dict[str, Any]]]]]] = [
                ("appends", lambda: load.appends(sizes.appends)),
                ("tool_calls", lambda: load.tool_calls(sizes.tool_calls)),
                ("large_results", lambda: load.large_results(sizes.large_calls)),
                ("assemble", lambda: load.assembles(sizes.assembles, long_runs)),
                ("mixed", lambda: load.mixed(sizes.mixed_seconds, long_runs)),
            ]
            for phase, run in phases:
                before = self.counters.snapshot()
                meter.start()
                with sampled(self.counters) as samples:
                    operations, figures = await run()
                cpu = meter.stop(per=max(1, operations))
                spent = delta(before, self.counters.snapshot())
                per = spent.per(max(1, operations))
                unit = {"appends": "per_record", "mixed": "per_operation"}.get(phase, "per_call")
                row[phase] = {
                    **figures,
                    unit: per,
                    "cpu_ms": cpu,
                    "activity": samples.summary(),
                }
                if phase in ("appends", "tool_calls", "assemble"):
                    row[phase]["top_statements"] = spent.top_statements(max(1, operations))
                samples_all.append(samples.summary())
            row["errors"] = load.errors
            row["errors_by_rpc"] = dict(load.errors_by_rpc)
            row["records_checked"] = await load.check_logs()
            row["lost_or_duplicated"] = 0
            row["server_connections_max"] = max(
                s.get("server_connections_max", 0) for s in samples_all
            )
            row["pgbouncer_clients_max"] = max(
                s.get("pgbouncer_clients_max", 0) for s in samples_all
            )
            row["lock_waiting_samples"] = sum(s.get("lock_waiting_samples", 0) for s in samples_all)
            return row


def _children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


_bouncer_pids: dict[str, int | None] = {}


def _pgbouncer_cpu(url: str) -> float:
    if url not in _bouncer_pids:
        _bouncer_pids[url] = pgbouncer_pid(url)
    pid = _bouncer_pids[url]
    return 0.0 if pid is None else process_cpu_seconds(pid)


class _Load:
    """The clients: `CONCURRENCY` workers, worker i on sidecar i mod the count, each on a Run
    of its own; failed calls are counted (appends are retried with the same request id, so
    the log check stays exact)."""

    def __init__(self, fleet: _Fleet, channels: list[grpc.aio.Channel]) -> None:
        self.fleet = fleet
        self.runs = [run_service_pb2_grpc.RunServiceStub(ch) for ch in channels]
        self.tools = [tool_service_pb2_grpc.ToolServiceStub(ch) for ch in channels]
        self.turns = [turn_service_pb2_grpc.TurnServiceStub(ch) for ch in channels]
        self.errors = 0
        self.errors_by_rpc: dict[str, int] = {}
        # run id -> records acknowledged (append Runs), tool calls acknowledged (tool Runs)
        self.appended: dict[str, int] = {}
        self.called: dict[str, int] = {}
        self.acknowledged_calls: dict[str, list[str]] = {}

    def _failed(self, rpc: str, error: object) -> None:
        self.errors += 1
        self.errors_by_rpc[rpc] = self.errors_by_rpc.get(rpc, 0) + 1
        self.fleet.ctx.log(f"{rpc} failed: {error}")

    async def ready(self) -> None:
        """Each sidecar's MCP session open: a first echo call through each answers."""
        for index, tools in enumerate(self.tools):
            (run_id,) = await _create_runs(self.runs[index], 1)
            for attempt in range(600):
                # A new call id each time: a failed call's answer is recorded as it is.
                request = _call(run_id, f"warm{attempt}", "echo", text="hi")
                outcome = (await tools.CallDeferredTool(request, timeout=60)).outcome
                if not outcome.is_error:
                    break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("the fixture server's tools never became callable")

    async def _workers(
        self, total: int, concurrency: int, kind: str, call: Callable[[int, str], Awaitable[None]]
    ) -> float:
        """`total` calls by `concurrency` workers, each on a new Run; the seconds taken."""
        run_ids = await _create_runs(self.runs[0], concurrency)
        book = self.appended if kind == "append" else self.called
        book.update(dict.fromkeys(run_ids, 0))
        remaining = total

        async def worker(index: int) -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await call(index, run_ids[index])

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return time.perf_counter() - start

    async def append_one(self, index: int, run_id: str) -> None:
        runs = self.runs[index % len(self.runs)]
        sequence = self.appended[run_id]
        request = run_service_pb2.AppendRecordsRequest(
            run_id=run_id, request_id=f"a{sequence}", records=[_record(sequence)]
        )
        for attempt in range(RETRIES):
            try:
                await runs.AppendRecords(request, timeout=60)
                break
            except grpc.RpcError as error:
                self._failed("AppendRecords", error)
                if attempt == RETRIES - 1:
                    raise
                await asyncio.sleep(0.1)
        self.appended[run_id] = sequence + 1

    async def call_one(self, index: int, run_id: str, tool: str = "echo", **args: Any) -> None:
        tools = self.tools[index % len(self.tools)]
        number = self.called[run_id]
        self.called[run_id] = number + 1
        call_id = f"c{number}"
        try:
            response = await tools.CallDeferredTool(
                _call(run_id, call_id, tool, **(args or {"text": "hello"})), timeout=120
            )
        except grpc.RpcError as error:
            self._failed("CallDeferredTool", error)
            return
        self.acknowledged_calls.setdefault(run_id, []).append(call_id)
        if response.outcome.is_error:
            self._failed("CallDeferredTool", response.outcome.result_json[:300])

    async def appends(self, total: int) -> tuple[int, dict[str, Any]]:
        seconds = await self._workers(total, CONCURRENCY, "append", self.append_one)
        return total, {"records_per_s": round(total / seconds, 1), "records": total}

    async def tool_calls(self, total: int) -> tuple[int, dict[str, Any]]:
        seconds = await self._workers(total, CONCURRENCY, "call", self.call_one)
        return total, {"calls_per_s": round(total / seconds, 1), "calls": total}

    async def large_results(self, total: int) -> tuple[int, dict[str, Any]]:
        async def large(index: int, run_id: str) -> None:
            # Seeded: random letters, which PostgreSQL's compression cannot shrink to nothing
            # as it would a run of one character.
            await self.call_one(
                index, run_id, "huge_text", size=LARGE_RESULT_CHARS, seed=self.called[run_id]
            )

        seconds = await self._workers(total, LARGE_CONCURRENCY, "call", large)
        return total, {
            "calls_per_s": round(total / seconds, 2),
            "calls": total,
            "result_chars": LARGE_RESULT_CHARS,
        }

    async def assemble_one(self, index: int, long_runs: list[str]) -> None:
        turns = self.turns[index % len(self.turns)]
        request = turn_service_pb2.AssemblePromptRequest(run_id=long_runs[index % 2], model="m")
        try:
            response = await turns.AssemblePrompt(request, timeout=120)
        except grpc.RpcError as error:
            self._failed("AssemblePrompt", error)
            return
        if not response.anthropic_request_json:
            self._failed("AssemblePrompt", "no request body")

    async def assembles(self, total: int, long_runs: list[str]) -> tuple[int, dict[str, Any]]:
        """`total` AssemblePrompt calls on the long Runs, two at a time."""
        latencies: list[float] = []
        remaining = total

        async def worker(index: int) -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                start = time.perf_counter()
                await self.assemble_one(index, long_runs)
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(2)))
        seconds = time.perf_counter() - start
        return total, {
            "calls_per_s": round(total / seconds, 2),
            "calls": total,
            "p50_ms": round(_percentile(latencies, 0.5) * 1000, 1),
        }

    async def mixed(self, seconds: float, long_runs: list[str]) -> tuple[int, dict[str, Any]]:
        """For `seconds`: 8 appenders, 6 tool callers and 2 AssemblePrompt callers on the long
        Runs, at once."""
        appenders = await _create_runs(self.runs[0], 8)
        callers = await _create_runs(self.runs[0], 6)
        self.appended.update(dict.fromkeys(appenders, 0))
        self.called.update(dict.fromkeys(callers, 0))
        latencies: dict[str, list[float]] = {}
        deadline = time.monotonic() + seconds

        async def timed(rpc: str, call: Awaitable[None]) -> None:
            start = time.perf_counter()
            await call
            latencies.setdefault(rpc, []).append(time.perf_counter() - start)

        async def worker(index: int) -> None:
            while time.monotonic() < deadline:
                if index < 8:
                    await timed("AppendRecords", self.append_one(index, appenders[index]))
                elif index < 14:
                    await timed("CallDeferredTool", self.call_one(index, callers[index - 8]))
                else:
                    await timed("AssemblePrompt", self.assemble_one(index, long_runs))

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(CONCURRENCY)))
        elapsed = time.perf_counter() - start
        operations = sum(len(values) for values in latencies.values())
        return operations, {
            "seconds": round(elapsed, 1),
            "operations": operations,
            "latency_ms": {
                rpc: {
                    "count": len(values),
                    "p50": round(_percentile(values, 0.5) * 1000, 1),
                    "p99": round(_percentile(values, 0.99) * 1000, 1),
                }
                for rpc, values in sorted(latencies.items())
            },
        }

    async def check_logs(self) -> int:
        """Every acknowledged append stored once, in order; every tool call's result once."""
        runs = self.runs[-1]
        total = 0
        for run_id, count in self.appended.items():
            records = await _all_records(runs, run_id)
            if [r.sequence for r in records] != list(range(1, count + 1)):
                raise AssertionError(
                    f"{run_id}: {count} appends acknowledged, {len(records)} stored"
                )
            for record in records:
                if not record.tool_result.content[0].text.startswith(
                    f"tool output {record.sequence - 1} "
                ):
                    raise AssertionError(f"{run_id} #{record.sequence} holds another record")
            total += len(records)
        for run_id in self.called:
            records = await _all_records(runs, run_id)
            stored = Counter(r.tool_result.call_id for r in records if r.HasField("tool_result"))
            acknowledged = self.acknowledged_calls.get(run_id, [])
            missing = [c for c in acknowledged if stored[c] != 1]
            if missing or any(n > 1 for n in stored.values()):
                raise AssertionError(
                    f"{run_id}: {len(acknowledged)} tool calls acknowledged; results of "
                    f"{missing[:5]} not stored once, {sum(stored.values())} results stored"
                )
            total += len(records)
        return total


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _call(run_id: str, call_id: str, tool: str, **arguments: Any) -> Any:
    struct = struct_pb2.Struct()
    struct.update(arguments)
    return tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id, server=SERVER, tool=tool, arguments=struct, call_id=call_id
    )


def _record(index: int) -> run_pb2.Record:
    text = f"tool output {index} " + "x" * 200
    return run_pb2.Record(
        tool_result=run_pb2.ToolResult(
            call_id=f"r{index}", content=[content_pb2.ContentPart(text=text)]
        )
    )


async def _create_runs(runs: run_service_pb2_grpc.RunServiceAsyncStub, count: int) -> list[str]:
    request = run_service_pb2.CreateRunRequest(tenant=TENANT, spec_name=SPEC, spec_version=1)
    return [(await runs.CreateRun(request, timeout=60)).run.run_id for _ in range(count)]


async def _fill(runs: run_service_pb2_grpc.RunServiceAsyncStub, run_id: str, turns: int) -> None:
    """`turns` turns of a user message, an assistant message calling 3 tools, their 3 results
    (200 characters each: 250 turns fit the default context window of 200,000 tokens), an
    assistant calling one more, its result and an answer."""
    line = "2026-12-01T12:00:00Z INFO request handled status=200 took=12ms\n"
    output = (line * (200 // len(line) + 1))[:200]
    batch: list[run_pb2.Record] = []
    for turn in range(turns):
        calls = [f"t{turn}c{i}" for i in range(4)]
        batch.append(
            run_pb2.Record(
                user_message=run_pb2.UserMessage(
                    content=[content_pb2.ContentPart(text=f"Question {turn}: what failed?")]
                )
            )
        )
        for group in (calls[:3], calls[3:]):
            batch.append(
                run_pb2.Record(
                    assistant_message=run_pb2.AssistantMessage(
                        tool_calls=[
                            content_pb2.ToolCall(call_id=c, name="fx__echo", arguments_json="{}")
                            for c in group
                        ]
                    )
                )
            )
            batch += [
                run_pb2.Record(
                    tool_result=run_pb2.ToolResult(
                        call_id=c, tool="echo", content=[content_pb2.ContentPart(text=output)]
                    )
                )
                for c in group
            ]
        batch.append(
            run_pb2.Record(
                assistant_message=run_pb2.AssistantMessage(
                    content=[content_pb2.ContentPart(text=f"Answer {turn}.")]
                )
            )
        )
        if len(batch) >= 400:
            await runs.AppendRecords(
                run_service_pb2.AppendRecordsRequest(run_id=run_id, records=batch), timeout=600
            )
            batch = []
    batch.append(
        run_pb2.Record(
            user_message=run_pb2.UserMessage(content=[content_pb2.ContentPart(text="One more.")])
        )
    )
    await runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=batch), timeout=600
    )


async def _all_records(
    runs: run_service_pb2_grpc.RunServiceAsyncStub, run_id: str
) -> list[run_pb2.Record]:
    records: list[run_pb2.Record] = []
    token = ""
    while True:
        page = await runs.ListRecords(
            run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=1000, page_token=token),
            timeout=60,
        )
        records.extend(page.records)
        token = page.next_page_token
        if not token:
            return records

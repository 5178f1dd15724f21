"""append_scaling_2_sidecars: append throughput of two sidecars sharing one PostgreSQL,
relative to one sidecar on the same database, in the same run."""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics

import grpc.aio

from bench._load import median
from bench._pgstats import (
    CpuMeter,
    DatabaseCounters,
    delta,
    postgres_cpu_seconds,
    process_cpu_seconds,
)
from bench._postgres import POSTGRES_URL_ENV, fresh_database
from bench._proc import channel, sidecar
from bench.registry import BenchContext, case
from psych.sidecar.v1 import (
    content_pb2,
    run_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    spec_service_pb2,
    spec_service_pb2_grpc,
)

# Total appends in flight, the same whether one sidecar or two take them.
CONCURRENCY = 16


@case("append_scaling_2_sidecars", unit="ratio", target=">= 1.2")
async def append_scaling_2_sidecars(ctx: BenchContext) -> float:
    """Records/s appended through two sidecars (distinct Runs, one PostgreSQL) divided by
    records/s through one of them, with the same 16 appends in flight from the same client.

    Both sidecars run throughout; rounds alternate one-sidecar and two-sidecar (ABBA) and the
    medians are compared. Afterwards every Run's log is read back: every acknowledged record
    must be stored exactly once, with gap-free sequences. The database, both sidecars and the
    client share this machine's cores: the details give the CPU milliseconds each spent per
    record (medians over the rounds; `other_cpu_ms` is the rest of the machine) and the
    statements PostgreSQL ran per append (pg_stat_statements, when preloaded).
    """
    appends = ctx.pick(full=4000, quick=600)
    rounds = ctx.pick(full=6, quick=2)
    with fresh_database() as database_url:
        name = database_url.rpartition("/")[2]
        counters = DatabaseCounters(os.environ[POSTGRES_URL_ENV], name, None)
        async with (
            sidecar(ctx.tmp_dir, database_url=database_url, name="sidecar-a") as first,
            sidecar(ctx.tmp_dir, database_url=database_url, name="sidecar-b") as second,
            channel(first.target) as first_channel,
            channel(second.target) as second_channel,
        ):
            stubs = [
                run_service_pb2_grpc.RunServiceStub(first_channel),
                run_service_pb2_grpc.RunServiceStub(second_channel),
            ]
            run_ids = await _create_runs(first_channel, stubs[0], CONCURRENCY)
            acknowledged = dict.fromkeys(run_ids, 0)
            pids = [first.process.pid, second.process.pid]
            meter = CpuMeter(
                {
                    "client": lambda: process_cpu_seconds(os.getpid()),
                    "sidecars": lambda: sum(process_cpu_seconds(pid) for pid in pids),
                    "postgres": lambda: postgres_cpu_seconds(
                        os.environ.get("PSYCH_TEST_POSTGRES_DATA")
                    ),
                }
            )
            cpu: dict[int, list[dict[str, float]]] = {1: [], 2: []}

            async def measure(sidecars: int) -> float:
                remaining = appends

                async def worker(index: int) -> None:
                    nonlocal remaining
                    run_id, stub = run_ids[index], stubs[index % sidecars]
                    while remaining > 0:
                        remaining -= 1
                        request = run_service_pb2.AppendRecordsRequest(
                            run_id=run_id,
                            request_id=f"{run_id}-{acknowledged[run_id]}",
                            records=[_record(acknowledged[run_id])],
                        )
                        await stub.AppendRecords(request, timeout=60)
                        acknowledged[run_id] += 1

                loop = asyncio.get_running_loop()
                meter.start()
                start = loop.time()
                await asyncio.gather(*(worker(i) for i in range(CONCURRENCY)))
                rate = appends / (loop.time() - start)
                cpu[sidecars].append(meter.stop(per=appends))
                return rate

            await measure(2)  # warm-up: connections, caches, plans
            cpu = {1: [], 2: []}
            before = counters.snapshot()
            rates: dict[int, list[float]] = {1: [], 2: []}
            for round_index in range(rounds):
                for count in (1, 2) if round_index % 2 == 0 else (2, 1):
                    rates[count].append(await measure(count))
                ctx.log(
                    f"round {round_index + 1}/{rounds}: one sidecar {rates[1][-1]:.0f} "
                    f"records/s, two {rates[2][-1]:.0f} records/s"
                )
            spent = delta(before, counters.snapshot()).per(2 * rounds * appends)
            stored = await _check_logs(stubs[1], acknowledged)
        counters.close()

    one, two = median(rates[1]), median(rates[2])
    ctx.details.update(
        {
            "one_sidecar_records_per_s": round(one, 1),
            "two_sidecars_records_per_s": round(two, 1),
            "one_sidecar_rounds": [round(r, 1) for r in rates[1]],
            "two_sidecar_rounds": [round(r, 1) for r in rates[2]],
            "appends_per_round": appends,
            "concurrency": CONCURRENCY,
            "records_checked": stored,
            "lost_or_duplicated": 0,
            "per_append": spent,
            "cpu_ms_per_record": {
                str(count): _medians(rounds_cpu) for count, rounds_cpu in cpu.items()
            },
        }
    )
    return two / one


def _medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(r[key] for r in rounds), 3) for key in rounds[0]}


def _record(index: int) -> run_pb2.Record:
    text = f"tool output {index} " + "x" * 200
    return run_pb2.Record(
        tool_result=run_pb2.ToolResult(
            call_id=f"c{index}", content=[content_pb2.ContentPart(text=text)]
        )
    )


async def _create_runs(
    ch: grpc.aio.Channel, runs: run_service_pb2_grpc.RunServiceAsyncStub, count: int
) -> list[str]:
    specs = spec_service_pb2_grpc.SpecServiceStub(ch)
    await specs.PublishSpec(
        spec_service_pb2.PublishSpecRequest(spec=spec_pb2.Spec(name="bench", version=1)),
        timeout=30,
    )
    request = run_service_pb2.CreateRunRequest(tenant="bench", spec_name="bench", spec_version=1)
    return [(await runs.CreateRun(request, timeout=30)).run.run_id for _ in range(count)]


async def _check_logs(
    runs: run_service_pb2_grpc.RunServiceAsyncStub, acknowledged: dict[str, int]
) -> int:
    """Every acknowledged append stored exactly once: sequences 1..n, content in order."""
    total = 0
    for run_id, count in acknowledged.items():
        sequences: list[int] = []
        token = ""
        for _ in itertools.count():
            page = await runs.ListRecords(
                run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=1000, page_token=token),
                timeout=60,
            )
            for record in page.records:
                expected = f"tool output {record.sequence - 1} "
                if not record.tool_result.content[0].text.startswith(expected):
                    raise AssertionError(f"{run_id} #{record.sequence} holds another record")
                sequences.append(record.sequence)
            token = page.next_page_token
            if not token:
                break
        if sequences != list(range(1, count + 1)):
            raise AssertionError(
                f"{run_id}: {count} appends acknowledged, log holds sequences "
                f"{sequences[:5]}…{sequences[-5:]} ({len(sequences)})"
            )
        total += len(sequences)
    return total

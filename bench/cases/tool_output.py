"""ReadToolOutput's grep over a large stored result."""

from __future__ import annotations

import statistics
import time

import grpc.aio

from bench._proc import sidecar
from bench.registry import BenchContext, case
from psych.sidecar.v1 import (
    content_pb2,
    run_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    spec_service_pb2,
    spec_service_pb2_grpc,
    tool_service_pb2,
    tool_service_pb2_grpc,
)

MIB = 1024 * 1024
# The stored result travels in one request, so both ends take messages this large.
MESSAGE_BYTES = 256 * MIB
PATTERN = r"ERROR .*timeout"
SLOWER_PATTERN = r"(?i)took=9\d\dms"


def _log(size: int) -> str:
    """`size` bytes of log lines; one line in 2,000 is an error with a timeout."""
    lines = []
    total = 0
    index = 0
    while total < size:
        if index % 2000 == 1999:
            line = (
                f"2026-12-01T12:00:{index % 60:02d}Z ERROR worker={index % 97} upstream timeout\n"
            )
        else:
            line = (
                f"2026-12-01T12:00:{index % 60:02d}Z INFO worker={index % 97} "
                f"request={index} status=200 took={index % 1000}ms\n"
            )
        lines.append(line)
        total += len(line)
        index += 1
    return "".join(lines)[:size]


async def _grep_all(
    tools: tool_service_pb2_grpc.ToolServiceAsyncStub, run_id: str, handle: str, pattern: str
) -> tuple[float, int]:
    """Seconds to grep the whole result (following next_offset) and the matches found."""
    offset, matches = 0, 0
    start = time.perf_counter()
    while True:
        page = await tools.ReadToolOutput(
            tool_service_pb2.ReadToolOutputRequest(
                run_id=run_id, handle=handle, offset=offset, grep=pattern
            ),
            timeout=600,
        )
        matches += len(page.matches)
        if page.next_offset >= page.total_length:
            return time.perf_counter() - start, matches
        offset = page.next_offset


@case("grep_mib_per_s", unit="MiB/s", target=">= 100")
async def grep_mib_per_s(ctx: BenchContext) -> float:
    """ReadToolOutput with grep over one stored 100 MiB text result, in MiB of stored text
    per second, measured at the client (request to last page) against a sidecar process on
    SQLite.

    The pattern is `ERROR .*timeout` (one line in 2,000 matches); the median of several
    rounds is the value. Details give the same for `(?i)took=9\\d\\dms`, a case-insensitive
    pattern with no literal to skip ahead by (one line in 10 matches). --quick uses 16 MiB.
    """
    size = ctx.pick(full=100 * MIB, quick=16 * MIB)
    rounds = ctx.pick(full=5, quick=3)
    text = _log(size)
    options = [
        ("grpc.max_receive_message_length", MESSAGE_BYTES),
        ("grpc.max_send_message_length", MESSAGE_BYTES),
    ]
    async with (
        sidecar(ctx.tmp_dir, extra_args=["--max-message-bytes", str(MESSAGE_BYTES)]) as server,
        grpc.aio.insecure_channel(server.target, options=options) as ch,
    ):
        specs = spec_service_pb2_grpc.SpecServiceStub(ch)
        await specs.PublishSpec(
            spec_service_pb2.PublishSpecRequest(spec=spec_pb2.Spec(name="grep", version=1)),
            timeout=60,
        )
        runs = run_service_pb2_grpc.RunServiceStub(ch)
        run_id = (
            await runs.CreateRun(
                run_service_pb2.CreateRunRequest(tenant="bench", spec_name="grep", spec_version=1),
                timeout=60,
            )
        ).run.run_id
        record = run_pb2.Record(
            tool_result=run_pb2.ToolResult(
                call_id="c1", tool="logs", content=[content_pb2.ContentPart(text=text)]
            )
        )
        appended = await runs.AppendRecords(
            run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[record]), timeout=600
        )
        handle = appended.records[0].handle
        tools = tool_service_pb2_grpc.ToolServiceStub(ch)
        expected = text.count(" ERROR ")
        timings: dict[str, list[float]] = {PATTERN: [], SLOWER_PATTERN: []}
        await _grep_all(tools, run_id, handle, PATTERN)  # warm-up
        for index in range(rounds):
            for pattern in timings:
                seconds, matches = await _grep_all(tools, run_id, handle, pattern)
                if pattern == PATTERN and matches != expected:
                    raise AssertionError(f"grep found {matches} lines, expected {expected}")
                timings[pattern].append(seconds)
            ctx.log(f"round {index + 1}/{rounds}: {size / MIB / timings[PATTERN][-1]:.0f} MiB/s")
    rate = size / MIB / statistics.median(timings[PATTERN])
    ctx.details.update(
        {
            "stored_mib": size / MIB,
            "pattern": PATTERN,
            "matching_lines": expected,
            "median_seconds": round(statistics.median(timings[PATTERN]), 3),
            "case_insensitive_pattern": SLOWER_PATTERN,
            "case_insensitive_mib_per_s": round(
                size / MIB / statistics.median(timings[SLOWER_PATTERN]), 1
            ),
        }
    )
    return rate

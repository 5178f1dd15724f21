"""Robustness under load: loop_stall_ratio (does a 50 MB MCP result stall the event loop?) and
load_mixed_32_clients (32 clients of mixed RPCs: how many errors, and the latencies)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench._proc import REPO_ROOT, channel, sidecar
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
    usage_service_pb2,
    usage_service_pb2_grpc,
)

FIXTURE_SERVER = REPO_ROOT / "tests" / "mcp_servers" / "fixture_server.py"
MIB = 1024 * 1024
TENANT = "bench"


def _config(tmp_dir: Path) -> list[str]:
    """A settings file allowing the fixture MCP server (stdio), as --config arguments."""
    path = tmp_dir / "robustness.toml"
    path.write_text(
        "[mcp_commands.fixture]\n"
        f"argv = {json.dumps([sys.executable, str(FIXTURE_SERVER), 'stdio'])}\n"
        "allow_extra_args = true\n"
    )
    return ["--config", str(path)]


async def _setup(ch: grpc.aio.Channel, runs: int, tools: int) -> list[str]:
    """A connected fixture server and `runs` Runs that may use all of it."""
    connections = connection_service_pb2_grpc.ConnectionServiceStub(ch)
    await connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(
            connection=connection_pb2.Connection(
                tenant=TENANT,
                name="fx",
                stdio=connection_pb2.StdioTransport(
                    command="fixture", args=["--tools", str(tools)]
                ),
            )
        )
    )
    for _ in range(600):
        listed = await connections.ListConnections(
            connection_service_pb2.ListConnectionsRequest(tenant=TENANT)
        )
        if listed.connections and listed.connections[0].catalog_version:
            break
        await asyncio.sleep(0.1)
    else:
        raise RuntimeError("the fixture server was never listed")
    await spec_service_pb2_grpc.SpecServiceStub(ch).PublishSpec(
        spec_service_pb2.PublishSpecRequest(
            spec=spec_pb2.Spec(
                name="robust",
                version=1,
                instructions="Be robust.",
                grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")],
            )
        )
    )
    stub = run_service_pb2_grpc.RunServiceStub(ch)
    run_ids = []
    for _ in range(runs):
        created = await stub.CreateRun(
            run_service_pb2.CreateRunRequest(tenant=TENANT, spec_name="robust", spec_version=1)
        )
        run_ids.append(created.run.run_id)
    return run_ids


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _call_request(run_id: str, call_id: str, tool: str, **arguments: Any) -> Any:
    struct = struct_pb2.Struct()
    struct.update(arguments)
    return tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id, server="fx", tool=tool, arguments=struct, call_id=call_id
    )


@case("loop_stall_ratio", unit="ratio", target="<= 5")
async def loop_stall_ratio(ctx: BenchContext) -> float:
    """Health-check p99 while 50 MB MCP tool results are received, converted and recorded,
    divided by the idle health-check p99 of the same sidecar in the same run. A sidecar that
    converts results on its event loop answers health checks only between conversions.

    A second sidecar that does nothing (the control) is checked alternately with the first,
    idle and under the same load: its ratio is what the machine alone does to a health check
    while the MCP server writes, and the sidecar stores, 50 MB results on the same cores."""
    results = ctx.pick(full=4, quick=2)
    size = 50 * 1000 * 1000
    # Without tool search's model, which a sidecar starts loading in the background as it
    # starts: the idle baseline must be idle (the load's GIL holds made its p99 3-4 ms).
    quiet = [*_config(ctx.tmp_dir), "--semantic-search", "off"]
    async with (
        sidecar(ctx.tmp_dir, extra_args=quiet) as server,
        sidecar(ctx.tmp_dir, extra_args=quiet, name="control") as control,
        channel(server.target) as ch,
        channel(control.target) as control_ch,
    ):
        (run_id,) = await _setup(ch, runs=1, tools=0)
        stubs = (health_pb2_grpc.HealthStub(ch), health_pb2_grpc.HealthStub(control_ch))

        async def check_both(into: tuple[list[float], list[float]]) -> None:
            for stub, times in zip(stubs, into, strict=True):
                start = time.perf_counter()
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
                times.append(time.perf_counter() - start)

        for _ in range(50):  # warm-up
            await check_both(([], []))
        idle: tuple[list[float], list[float]] = ([], [])
        for _ in range(ctx.pick(full=600, quick=300)):
            await check_both(idle)
        loaded: tuple[list[float], list[float]] = ([], [])
        # The results are fetched by another process: receiving 50 MB responses in this one
        # would stall the loop that times the health checks, not the sidecar's.
        lander = await _start_lander(server.target, run_id, results, size)
        waiting = asyncio.create_task(lander.wait())
        while not waiting.done():
            await check_both(loaded)
            await asyncio.sleep(0.005)
        if await waiting != 0:
            raise RuntimeError("the process landing the 50 MB results failed")
        ratio, figures = _stall_figures(idle[0], loaded[0])
        control_ratio, control_figures = _stall_figures(idle[1], loaded[1])
        ctx.details.update(
            figures,
            loaded_checks=len(loaded[0]),
            results=results,
            result_bytes=size,
            peak_rss_mib=round(_peak_rss_mib(server.process.pid), 1),
            control_ratio=round(control_ratio, 2),
            **{f"control_{name}": value for name, value in control_figures.items()},
        )
        return ratio


async def _start_lander(
    target: str, run_id: str, results: int, size: int
) -> asyncio.subprocess.Process:
    """Another process that fetches `results` results of `size` characters (`_land`)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.cases.robustness",
        target,
        run_id,
        str(results),
        str(size),
        cwd=REPO_ROOT,
    )


def _stall_figures(idle: list[float], loaded: list[float]) -> tuple[float, dict[str, float]]:
    """Loaded p99 ÷ idle p99, and the percentiles behind it in milliseconds."""
    idle_p99, loaded_p99 = _percentile(idle, 0.99), _percentile(loaded, 0.99)
    return loaded_p99 / idle_p99, {
        "idle_p50_ms": round(_percentile(idle, 0.5) * 1000, 2),
        "idle_p99_ms": round(idle_p99 * 1000, 2),
        "loaded_p50_ms": round(_percentile(loaded, 0.5) * 1000, 2),
        "loaded_p99_ms": round(loaded_p99 * 1000, 2),
        "loaded_max_ms": round(max(loaded) * 1000, 2),
    }


@case("load_mixed_32_clients", unit="errors", target="<= 0")
async def load_mixed_32_clients(ctx: BenchContext) -> float:
    """32 clients, each with its own Run, loop over a mix of RPCs for 60 s (30 s with --quick):
    append a turn, resolve it, assemble the prompt, search, call an MCP tool, list the log,
    read the Run, record usage. The value is the number of failed calls (target 0); the
    details hold p50/p99 per RPC and the sidecar's peak RSS."""
    seconds = ctx.pick(full=60, quick=30)
    clients = 32
    async with (
        sidecar(ctx.tmp_dir, extra_args=_config(ctx.tmp_dir)) as server,
        channel(server.target) as ch,
    ):
        run_ids = await _setup(ch, runs=clients, tools=200)
        runs = run_service_pb2_grpc.RunServiceStub(ch)
        turns = turn_service_pb2_grpc.TurnServiceStub(ch)
        tools = tool_service_pb2_grpc.ToolServiceStub(ch)
        usage = usage_service_pb2_grpc.UsageServiceStub(ch)
        latencies: dict[str, list[float]] = {}
        errors: dict[str, int] = {}
        deadline = time.monotonic() + seconds

        async def timed(name: str, call: Any) -> Any:
            start = time.perf_counter()
            try:
                answer = await call
            except grpc.RpcError as error:
                errors[name] = errors.get(name, 0) + 1
                ctx.log(f"{name}: {error}")
                return None
            latencies.setdefault(name, []).append(time.perf_counter() - start)
            return answer

        async def client(run_id: str) -> None:
            turn = 0
            while time.monotonic() < deadline:
                turn += 1
                call_id = f"t{turn}"
                call = content_pb2.ToolCall(
                    call_id=call_id, name="fx__echo", arguments_json='{"text": "hi"}'
                )
                await timed(
                    "AppendRecords",
                    runs.AppendRecords(
                        run_service_pb2.AppendRecordsRequest(
                            run_id=run_id,
                            request_id=f"turn-{turn}",
                            records=[
                                run_pb2.Record(
                                    user_message=run_pb2.UserMessage(
                                        content=[content_pb2.ContentPart(text=f"turn {turn}")]
                                    )
                                ),
                                run_pb2.Record(
                                    assistant_message=run_pb2.AssistantMessage(tool_calls=[call])
                                ),
                            ],
                        ),
                        timeout=30,
                    ),
                )
                await timed(
                    "ResolveTurn",
                    turns.ResolveTurn(
                        turn_service_pb2.ResolveTurnRequest(run_id=run_id), timeout=30
                    ),
                )
                await timed(
                    "SearchTools",
                    tools.SearchTools(
                        tool_service_pb2.SearchToolsRequest(run_id=run_id, query="generated 17"),
                        timeout=30,
                    ),
                )
                await timed(
                    "CallDeferredTool",
                    tools.CallDeferredTool(
                        _call_request(run_id, call_id, "echo", text="hi"), timeout=30
                    ),
                )
                await timed(
                    "AssemblePrompt",
                    turns.AssemblePrompt(
                        turn_service_pb2.AssemblePromptRequest(run_id=run_id), timeout=30
                    ),
                )
                await timed(
                    "ListRecords",
                    runs.ListRecords(
                        run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=50),
                        timeout=30,
                    ),
                )
                await timed(
                    "GetRun", runs.GetRun(run_service_pb2.GetRunRequest(run_id=run_id), timeout=30)
                )
                await timed(
                    "RecordUsage",
                    usage.RecordUsage(
                        usage_service_pb2.RecordUsageRequest(
                            run_id=run_id,
                            request_id=f"usage-{turn}",
                            model="m",
                            input_tokens=100,
                            output_tokens=10,
                        ),
                        timeout=30,
                    ),
                )

        await asyncio.gather(*(client(run_id) for run_id in run_ids))
        ctx.details.update(
            seconds=seconds,
            clients=clients,
            calls=sum(len(values) for values in latencies.values()),
            errors_by_rpc=errors,
            peak_rss_mib=round(_peak_rss_mib(server.process.pid), 1),
            latency_ms={
                name: {
                    "p50": round(_percentile(values, 0.5) * 1000, 1),
                    "p99": round(_percentile(values, 0.99) * 1000, 1),
                    "count": len(values),
                }
                for name, values in sorted(latencies.items())
            },
        )
        return float(sum(errors.values()))


def _land(target: str, run_id: str, results: int, size: int) -> None:
    """Make `results` calls of huge_text(size), one after another (loop_stall_ratio's load)."""
    options = [("grpc.max_receive_message_length", 128 * MIB)]
    with grpc.insecure_channel(target, options=options) as ch:
        tools = tool_service_pb2_grpc.ToolServiceStub(ch)
        for index in range(results):
            outcome = tools.CallDeferredTool(
                _call_request(run_id, f"big-{index}", "huge_text", size=size), timeout=300
            ).outcome
            if outcome.is_error:
                raise SystemExit(f"the {size}-byte call failed: {outcome.result_json[:500]!r}")


if __name__ == "__main__":
    _land(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))

"""What a sidecar costs its pod: private memory idle and while large results land, and the
time from exec to health SERVING against a bare gRPC server's."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench._load import median
from bench._proc import (
    ManagedProcess,
    channel,
    compile_sidecar_modules,
    free_port,
    sidecar,
    sidecar_command,
    sidecar_env,
)
from bench.cases.robustness import _config, _setup, _start_lander
from bench.cases.tool_surface import _commands_env, _connect_twilio, _Host, _twilio_argv, _warm_up
from bench.registry import BenchContext, case

KIB_PER_MIB = 1024


def memory_mib(pid: int) -> dict[str, float]:
    """The process's memory from /proc/PID/status in MiB: RssAnon (private: heap, arrays,
    thread stacks), RssFile (file pages mapped, shared with the page cache: libraries, the
    memory-mapped model), VmRSS (their sum, with shared memory) and VmHWM (VmRSS's peak)."""
    figures = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("RssAnon", "RssFile", "VmRSS", "VmHWM"):
            figures[name] = int(value.split()[0]) / KIB_PER_MIB
    return figures


@case("idle_private_mib", unit="MiB", target="<= 150")
async def idle_private_mib(ctx: BenchContext) -> float:
    """Private memory (RssAnon, MiB) of an idle sidecar with semantic search on, once it has
    connected the real Twilio MCP server (1,409 tools; --quick: its first 8 services) and its
    search warm-up has encoded the listing.

    One sidecar (SQLite, `semantic_search = auto`), Twilio deferred over stdio; after the
    warm-up's log line, 12 s of idleness (memory malloc kept through the warm-up goes back
    within ~10 s), then the sidecar's /proc status is read ten times
    over a second: the value is the last RssAnon. Details: RSS (VmRSS) and its file-backed
    part (RssFile: libraries and the memory-mapped model, pages the kernel shares and can
    drop), the peak RSS (VmHWM), and the warm-up's figures.
    """
    argv = _twilio_argv(8 if ctx.quick else None)
    env = {**_commands_env({"twilio": argv}), "PSYCH_SIDECAR_SEMANTIC_SEARCH": "auto"}
    async with (
        sidecar(ctx.tmp_dir, env=env, name="idle") as server,
        channel(server.target) as ch,
    ):
        await _connect_twilio(_Host(ch))
        warm_up = await _warm_up(ctx.tmp_dir / "idle.log", "auto")
        await asyncio.sleep(12.0)
        samples = []
        for _ in range(10):
            samples.append(memory_mib(server.process.pid))
            await asyncio.sleep(0.1)
    last = samples[-1]
    ctx.details.update(
        {
            "rss_mib": round(last["VmRSS"], 1),
            "rss_file_mib": round(last["RssFile"], 1),
            "peak_rss_mib": round(last["VmHWM"], 1),
            "rss_anon_min_max_mib": [
                round(min(s["RssAnon"] for s in samples), 1),
                round(max(s["RssAnon"] for s in samples), 1),
            ],
            "warm_up": warm_up,
        }
    )
    return round(last["RssAnon"], 1)


@case("peak_private_mib_large_results", unit="MiB", target="<= 350")
async def peak_private_mib_large_results(ctx: BenchContext) -> float:
    """Peak private memory (RssAnon, MiB) of a sidecar while 50 MB tool results land, as in
    `loop_stall_ratio`: `CallDeferredTool` of the fixture MCP server's `huge_text` over stdio,
    4 results (--quick: 2) one after another, made by another process.

    The sidecar (SQLite, `--semantic-search off` as in `loop_stall_ratio`) is sampled from
    /proc every 5 ms while they land (VmHWM, the kernel's own peak, counts file pages too).
    Details: RssAnon idle before and settled 12 s after (memory malloc kept for the results
    goes back within ~10 s), the peak RSS (VmHWM), the samples taken.
    """
    results = ctx.pick(full=4, quick=2)
    size = 50 * 1000 * 1000
    quiet = [*_config(ctx.tmp_dir), "--semantic-search", "off"]
    async with sidecar(ctx.tmp_dir, extra_args=quiet) as server, channel(server.target) as ch:
        (run_id,) = await _setup(ch, runs=1, tools=0)
        pid = server.process.pid
        await asyncio.sleep(1.0)
        idle = memory_mib(pid)["RssAnon"]
        lander = await _start_lander(server.target, run_id, results, size)
        waiting = asyncio.create_task(lander.wait())
        peak, samples = idle, 0
        while not waiting.done():
            peak = max(peak, memory_mib(pid)["RssAnon"])
            samples += 1
            await asyncio.sleep(0.005)
        if await waiting != 0:
            raise RuntimeError("the process landing the 50 MB results failed")
        await asyncio.sleep(12.0)
        after = memory_mib(pid)
    ctx.details.update(
        {
            "idle_rss_anon_mib": round(idle, 1),
            "settled_rss_anon_mib": round(after["RssAnon"], 1),
            "peak_rss_mib": round(after["VmHWM"], 1),
            "results": results,
            "result_bytes": size,
            "samples": samples,
        }
    )
    return round(peak, 1)


async def _time_to_serving(
    name: str, argv: list[str], port: int, log: Path, env: dict[str, str] | None = None
) -> float:
    """Seconds from exec to the first health Check("") answered SERVING on 127.0.0.1:port.

    The port is polled with a plain TCP connect every 5 ms, then Check is asked every 5 ms on
    a channel opened once it accepts: a gRPC channel polled before the server listens times
    the channel's reconnect backoff, not the server."""
    process = ManagedProcess(name, argv, log, env)
    started = time.perf_counter()
    with process:
        while True:
            process.check_alive()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.perf_counter() - started > 120:
                raise RuntimeError(f"{name} did not listen within 120 s")
            await asyncio.sleep(0.005)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                process.check_alive()
                try:
                    answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.perf_counter() - started
                except grpc.RpcError:
                    pass
                if time.perf_counter() - started > 120:
                    raise RuntimeError(f"{name} did not serve within 120 s")
                await asyncio.sleep(0.005)


# The libraries `serve` cannot answer without, whatever its own code does: the configuration
# (pydantic-settings, and pydantic under it) and the storage (SQLAlchemy).
STARTUP_LIBRARIES = ("pydantic_settings", "sqlalchemy")


@case("startup_ratio", unit="ratio", target="<= 3")
async def startup_ratio(ctx: BenchContext) -> float:
    """Seconds from exec to health SERVING of `psych-sidecar serve` divided by the same for a
    bare grpc.aio server with only the health service (`bench/_health_server.py`), medians of
    rounds alternating the two in the same run.

    The sidecar runs with its defaults (semantic search on, the model installed) on a SQLite
    database already at the current schema, as when a pod restarts: a first start, on the
    fresh database, applied the migrations. Details: both medians and every round, and that
    first start apart. The sidecar's modules are compiled first, as in the image.

    A third server is timed in the same rounds: the bare one, importing first the libraries
    the sidecar's start needs (`STARTUP_LIBRARIES`). Its ratio to the bare server
    (`libraries_floor_ratio`) is what no change to the sidecar's own start can go below.
    """
    compile_sidecar_modules()
    rounds = ctx.pick(full=7, quick=3)
    database = ctx.tmp_dir / "startup.sqlite3"

    def sidecar_argv(port: int, url: str) -> list[str]:
        return [*sidecar_command(), "serve", "--listen", f"127.0.0.1:{port}", "--database-url", url]

    # The first start applies the migrations to the fresh database; the rounds find it current.
    fresh_port = free_port()
    fresh = await _time_to_serving(
        "sidecar-fresh",
        sidecar_argv(fresh_port, f"sqlite:///{database}"),
        fresh_port,
        ctx.tmp_dir / "sidecar-fresh.log",
        sidecar_env(),
    )
    times: dict[str, list[float]] = {"sidecar": [], "bare": [], "floor": []}
    for index in range(rounds):
        # Each target goes first, second and last equally often over the rounds.
        order = list(times)[index % 3 :] + list(times)[: index % 3]
        for target in order:
            port = free_port()
            log = ctx.tmp_dir / f"{target}-{index}.log"
            if target == "sidecar":
                argv = sidecar_argv(port, f"sqlite:///{database}")
                seconds = await _time_to_serving(target, argv, port, log, sidecar_env())
            else:
                argv = [
                    sys.executable,
                    "-m",
                    "bench._health_server",
                    "--listen",
                    f"127.0.0.1:{port}",
                ]
                if target == "floor":
                    argv += [arg for module in STARTUP_LIBRARIES for arg in ("--import", module)]
                seconds = await _time_to_serving(target, argv, port, log)
            times[target].append(seconds)
            ctx.log(f"round {index + 1}: {target} SERVING after {seconds:.3f} s")
    sidecar_s, bare_s, floor_s = (median(times[target]) for target in times)
    ctx.details.update(
        {
            "sidecar_s": round(sidecar_s, 3),
            "bare_s": round(bare_s, 3),
            "libraries_floor_s": round(floor_s, 3),
            "libraries_floor_ratio": round(floor_s / bare_s, 2),
            "libraries_floor": list(STARTUP_LIBRARIES),
            **{f"{target}_rounds_s": [round(t, 3) for t in times[target]] for target in times},
            "sidecar_fresh_database_s": round(fresh, 3),
        }
    )
    return round(sidecar_s / bare_s, 2)

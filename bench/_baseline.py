"""A server's throughput against the bare echo baseline, measured side by side in one run.

Shared by the `*_overhead_ratio` cases: the same client drives each target with the same
concurrency; with two or more CPUs the client is pinned to one half and the servers to the
other; after a warm-up of each, rounds alternate their order (ABAB then BABA) and the medians
are compared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence

from bench._load import drive, median
from bench._proc import Server, cpu_split, pin, pinned_self
from bench.registry import BenchContext

CONCURRENCY = 16

Call = Callable[[], Awaitable[object]]


async def alternate(
    ctx: BenchContext,
    targets: dict[str, Call],
    servers: Sequence[Server],
    *,
    calls: int,
    warmup: int,
    rounds: int,
) -> dict[str, list[float]]:
    """Warm each target up, then run rounds alternating their order; calls/s per round."""
    rates: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    with contextlib.ExitStack() as stack:
        split = cpu_split()
        ctx.details["pinned"] = split is not None
        if split is not None:
            client_cpus, server_cpus = split
            for server in servers:
                pin(server.process.pid, server_cpus)
            stack.enter_context(pinned_self(client_cpus))
            ctx.log(f"client on CPUs {sorted(client_cpus)}, servers on {sorted(server_cpus)}")
        for fn in targets.values():
            await drive(fn, calls=warmup, concurrency=CONCURRENCY)
        for i in range(rounds):
            order = names if i % 2 == 0 else list(reversed(names))
            for name in order:
                result = await drive(targets[name], calls=calls, concurrency=CONCURRENCY)
                rates[name].append(result.per_second)
            ctx.log(
                f"round {i + 1}/{rounds}: "
                + ", ".join(f"{name} {rates[name][-1]:.0f}/s" for name in names)
            )
    return rates


def ratio_to_echo(ctx: BenchContext, rates: dict[str, list[float]], calls: int) -> float:
    """The sidecar's median calls/s over the echo baseline's, with both recorded in details."""
    echo_rate, side_rate = median(rates["echo"]), median(rates["sidecar"])
    ctx.details.update(
        {
            "baseline_calls_per_s": round(echo_rate, 1),
            "sidecar_calls_per_s": round(side_rate, 1),
            "baseline_rounds": [round(r, 1) for r in rates["echo"]],
            "sidecar_rounds": [round(r, 1) for r in rates["sidecar"]],
            "calls_per_round": calls,
            "concurrency": CONCURRENCY,
        }
    )
    return side_rate / echo_rate


# The sidecar variants the overhead cases measure side by side: both off (no admin listener,
# no tracing), metrics only, metrics with tracing at the parent-based ratio an operator leaves
# on (0.1: the calls carry no traceparent, so one trace in ten is sampled), and metrics with
# every trace sampled (1.0, the earlier configuration). Sampled spans are made, ended and
# handed to the batch span processor as in production, whose exporter drops them
# (OTEL_TRACES_EXPORTER=none). The case's value is the 0.1 variant's ratio.
_TRACED = ["--admin-listen", "127.0.0.1:0", "--tracing", "otlp", "--tracing-sample-ratio"]
VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "sidecar": ([], {}),
    "metrics": (["--admin-listen", "127.0.0.1:0"], {}),
    "observed": ([*_TRACED, "0.1"], {"OTEL_TRACES_EXPORTER": "none"}),
    "traced_all": ([*_TRACED, "1"], {"OTEL_TRACES_EXPORTER": "none"}),
}


def ratio_of_variants(ctx: BenchContext, rates: dict[str, list[float]], calls: int) -> float:
    """The observed sidecar's (metrics, tracing at 0.1) median calls/s over the echo
    baseline's; the details give each variant's ratio and the cost of metrics, of metrics with
    tracing at 0.1 and at 1.0, against both off."""
    echo = median(rates["echo"])
    medians = {name: median(rates[name]) for name in VARIANTS}
    off = medians["sidecar"]
    ctx.details.update(
        {
            "baseline_calls_per_s": round(echo, 1),
            "sidecar_calls_per_s": round(off, 1),
            "ratio_both_off": round(off / echo, 4),
            "ratio_metrics": round(medians["metrics"] / echo, 4),
            "ratio_metrics_and_tracing": round(medians["observed"] / echo, 4),
            "ratio_metrics_and_tracing_all": round(medians["traced_all"] / echo, 4),
            "cost_metrics_pct": round(100 * (1 - medians["metrics"] / off), 2),
            "cost_metrics_and_tracing_pct": round(100 * (1 - medians["observed"] / off), 2),
            "cost_metrics_and_tracing_all_pct": round(100 * (1 - medians["traced_all"] / off), 2),
            "calls_per_round": calls,
            "concurrency": CONCURRENCY,
            **{f"{name}_rounds": [round(r, 1) for r in rates[name]] for name in rates},
        }
    )
    return medians["observed"] / echo

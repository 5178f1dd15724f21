"""rpc_overhead_ratio: the sidecar's GetRun throughput relative to a bare
grpc.aio echo server, both measured from the same client in the same run."""

from __future__ import annotations

import contextlib
import functools

import grpc.aio

from bench._baseline import VARIANTS, Call, alternate, ratio_of_variants
from bench._echo_server import ECHO_METHOD
from bench._proc import channel, echo_server, sidecar
from bench.registry import BenchContext, case
from psych.sidecar.v1 import (
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    spec_service_pb2,
    spec_service_pb2_grpc,
)


@case("rpc_overhead_ratio", unit="ratio", target=">= 0.8")
async def rpc_overhead_ratio(ctx: BenchContext) -> float:
    """GetRun calls/s on the real sidecar, with metrics and tracing on (parent-based, 0.1),
    divided by a bare grpc.aio echo server's.

    Both servers are separate processes on 127.0.0.1 TCP, driven by the same
    grpc.aio client with 16 calls in flight and the same number of calls per
    round. With two or more CPUs the client is pinned to one half and the
    servers to the other. After a warm-up of each, rounds alternate between
    the targets (ABAB then BABA order) and the medians are compared. Four sidecars are
    measured beside the echo server: both off, metrics only (--admin-listen), and metrics with
    tracing (--tracing otlp, OTEL_TRACES_EXPORTER=none: sampled spans made, batched and
    dropped) at --tracing-sample-ratio 0.1 and at 1; the value is the 0.1 one's ratio, the
    details give each one's and the costs against both off.
    """
    calls = ctx.pick(full=6000, quick=1500)
    warmup = ctx.pick(full=1500, quick=500)
    rounds = ctx.pick(full=7, quick=3)

    async with contextlib.AsyncExitStack() as stack:
        echo_srv = await stack.enter_async_context(echo_server(ctx.tmp_dir))
        echo_ch = await stack.enter_async_context(channel(echo_srv.target))
        servers = [echo_srv]
        # The echo call carries the same request bytes the sidecar gets.
        echo_call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = echo_ch.unary_unary(ECHO_METHOD)
        payload = b""

        async def call_echo() -> object:
            return await echo_call(payload, timeout=30)

        targets: dict[str, Call] = {"echo": call_echo}
        for name, (args, env) in VARIANTS.items():
            server = await stack.enter_async_context(
                sidecar(ctx.tmp_dir, extra_args=args, env=env, name=name)
            )
            ch = await stack.enter_async_context(channel(server.target))
            ctx.log(f"{name} ready in {server.ready_seconds:.2f} s")
            runs = run_service_pb2_grpc.RunServiceStub(ch)
            request = await _setup_run(ch, runs)
            payload = request.SerializeToString()
            targets[name] = functools.partial(runs.GetRun, request, timeout=30)
            servers.append(server)

        rates = await alternate(ctx, targets, servers, calls=calls, warmup=warmup, rounds=rounds)
    return ratio_of_variants(ctx, rates, calls)


async def _setup_run(
    ch: grpc.aio.Channel, runs: run_service_pb2_grpc.RunServiceAsyncStub
) -> run_service_pb2.GetRunRequest:
    """Publish spec "bench" v1, create a Run of tenant "bench", check GetRun."""
    specs = spec_service_pb2_grpc.SpecServiceStub(ch)
    await specs.PublishSpec(
        spec_service_pb2.PublishSpecRequest(spec=spec_pb2.Spec(name="bench", version=1)),
        timeout=30,
    )
    created = await runs.CreateRun(
        run_service_pb2.CreateRunRequest(tenant="bench", spec_name="bench", spec_version=1),
        timeout=30,
    )
    request = run_service_pb2.GetRunRequest(run_id=created.run.run_id)
    got = await runs.GetRun(request, timeout=30)
    if not created.run.run_id or got.run.run_id != created.run.run_id:
        raise AssertionError(f"GetRun returned run {got.run.run_id!r} for {created.run.run_id!r}")
    return request

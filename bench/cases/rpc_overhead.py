"""rpc_overhead_ratio: the sidecar's GetRun throughput relative to a bare
grpc.aio echo server, both measured from the same client in the same run."""

from __future__ import annotations

import grpc.aio

from bench._baseline import alternate, ratio_to_echo
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


@case("rpc_overhead_ratio", unit="ratio", target=">= 0.6")
async def rpc_overhead_ratio(ctx: BenchContext) -> float:
    """GetRun calls/s on the real sidecar divided by a bare grpc.aio echo server's.

    Both servers are separate processes on 127.0.0.1 TCP, driven by the same
    grpc.aio client with 16 calls in flight and the same number of calls per
    round. With two or more CPUs the client is pinned to one half and the
    servers to the other. After a warm-up of each, rounds alternate between
    the two (ABAB then BABA order) and the medians are compared.
    """
    calls = ctx.pick(full=6000, quick=1500)
    warmup = ctx.pick(full=1500, quick=500)
    rounds = ctx.pick(full=7, quick=3)

    async with (
        echo_server(ctx.tmp_dir) as echo_srv,
        sidecar(ctx.tmp_dir) as side_srv,
        channel(echo_srv.target) as echo_ch,
        channel(side_srv.target) as side_ch,
    ):
        ctx.log(
            f"echo ready in {echo_srv.ready_seconds:.2f} s, "
            f"sidecar ready in {side_srv.ready_seconds:.2f} s"
        )
        runs = run_service_pb2_grpc.RunServiceStub(side_ch)
        request = await _setup_run(side_ch, runs)

        # The echo call carries the same request bytes the sidecar gets.
        payload = request.SerializeToString()
        echo_call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = echo_ch.unary_unary(ECHO_METHOD)

        async def call_echo() -> object:
            return await echo_call(payload, timeout=30)

        async def call_sidecar() -> object:
            return await runs.GetRun(request, timeout=30)

        rates = await alternate(
            ctx,
            {"echo": call_echo, "sidecar": call_sidecar},
            [echo_srv, side_srv],
            calls=calls,
            warmup=warmup,
            rounds=rounds,
        )
    return ratio_to_echo(ctx, rates, calls)


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

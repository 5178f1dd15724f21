"""The RPC interceptors' promise for a servicer that lacks an RPC of its service: the call
answers UNIMPLEMENTED with NOT_IMPLEMENTED, even though the generated base class the servicer
extends has a method of that name (one that would fail the call INTERNAL)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from psych.sidecar.v1 import spec_pb2, spec_service_pb2, spec_service_pb2_grpc
from psych_sidecar.api.rpc import InFlight, bind, rpc_server
from tests.support.sidecar import rpc_failure


class _PublishOnly(spec_service_pb2_grpc.SpecServiceServicer):
    """Answers PublishSpec; GetSpec is the generated base's."""

    async def PublishSpec(
        self, request: spec_service_pb2.PublishSpecRequest, context: Any
    ) -> spec_service_pb2.PublishSpecResponse:
        return spec_service_pb2.PublishSpecResponse(spec=request.spec)


def test_an_rpc_the_servicer_lacks_answers_unimplemented(tmp_path: Path) -> None:
    target = f"unix:{tmp_path / 'rpc.sock'}"

    def call_both() -> None:
        with grpc.insecure_channel(target) as channel:
            stub = spec_service_pb2_grpc.SpecServiceStub(channel)
            spec = spec_pb2.Spec(name="s", version=1)
            published = stub.PublishSpec(spec_service_pb2.PublishSpecRequest(spec=spec))
            assert published.spec == spec
            failure = rpc_failure(
                lambda: stub.GetSpec(spec_service_pb2.GetSpecRequest(name="s", version=1))
            )
            assert failure.code == grpc.StatusCode.UNIMPLEMENTED
            assert failure.info.reason == "NOT_IMPLEMENTED"
            assert failure.info.metadata["method"] == "/psych.sidecar.v1.SpecService/GetSpec"

    async def serve_and_call() -> None:
        service = spec_service_pb2.DESCRIPTOR.services_by_name["SpecService"]
        # GetSpec is left to the generated base on purpose, which its stub declares abstract.
        servicer = _PublishOnly()  # type: ignore[abstract]
        binding = bind(servicer, spec_service_pb2_grpc.add_SpecServiceServicer_to_server, service)
        server = rpc_server([binding], 1 << 20, InFlight())
        server.add_insecure_port(target)
        await server.start()
        try:
            await asyncio.to_thread(call_both)
        finally:
            await server.stop(None)

    asyncio.run(serve_and_call())

"""The contract as served: reflection, the ErrorReason catalogue, unimplemented RPCs."""

from __future__ import annotations

from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from psych.sidecar.v1 import errors_pb2
from psych_sidecar.api.errors import STATUS_CODES
from psych_sidecar.domain.errors import Reason

SERVICES = {
    "psych.sidecar.v1.SpecService",
    "psych.sidecar.v1.RunService",
    "psych.sidecar.v1.ConnectionService",
    "psych.sidecar.v1.TurnService",
    "psych.sidecar.v1.ToolService",
    "psych.sidecar.v1.UsageService",
}


def _reflect(
    channel: grpc.Channel, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    return next(iter(stub.ServerReflectionInfo(iter([request]))))


def test_reflection_lists_the_services_and_their_methods(grpc_channel: grpc.Channel) -> None:
    listed = _reflect(grpc_channel, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {service.name for service in listed.list_services_response.service}
    assert names >= SERVICES | {"grpc.health.v1.Health"}
    methods: set[str] = set()
    for service in SERVICES:
        response = _reflect(
            grpc_channel, reflection_pb2.ServerReflectionRequest(file_containing_symbol=service)
        )
        for raw in response.file_descriptor_response.file_descriptor_proto:
            file = descriptor_pb2.FileDescriptorProto.FromString(raw)
            for described in file.service:
                methods.update(f"{described.name}.{method.name}" for method in described.method)
    assert {
        "TurnService.ResolveTurn",
        "TurnService.AssemblePrompt",
        "ToolService.CallDeferredTool",
        "ToolService.ReadToolOutput",
        "ToolService.DispatchToolCall",
    } <= methods


def test_health_is_serving_for_every_service(grpc_channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(grpc_channel)
    for service in ["", *SERVICES]:
        response = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_the_domain_reasons_are_exactly_the_contract_catalogue() -> None:
    contract = {
        name.removeprefix("ERROR_REASON_")
        for name in errors_pb2.ErrorReason.keys()  # noqa: SIM118 (an enum wrapper, not a dict)
        if name != "ERROR_REASON_UNSPECIFIED"
    }
    assert {reason.value for reason in Reason} == contract
    assert set(STATUS_CODES) == set(Reason)


def test_the_error_catalogue_documents_every_reason_with_its_status() -> None:
    document = (Path(__file__).parent.parent / "docs" / "errors.md").read_text()
    for reason, code in STATUS_CODES.items():
        assert f"| `{reason.value}` | {code.name} |" in document, reason

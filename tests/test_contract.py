"""The contract as served: reflection, the ErrorReason catalogue, unimplemented RPCs."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from psych.sidecar.v1 import errors_pb2
from psych_sidecar.api.errors import STATUS_CODES
from psych_sidecar.domain import errors
from psych_sidecar.domain.errors import Reason, SidecarError

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


def _error_classes() -> dict[Reason, type[SidecarError]]:
    """The typed error of each reason: every concrete subclass of SidecarError, by reason."""
    found: dict[Reason, type[SidecarError]] = {}
    pending = list(SidecarError.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        reason = cls.__dict__.get("reason")
        if isinstance(reason, Reason):
            assert reason not in found, f"{reason} has two classes: {found[reason]}, {cls}"
            found[reason] = cls
    return found


def _documented_metadata_keys() -> dict[str, set[str]]:
    """docs/errors.md's metadata column, by reason: the key names quoted there."""
    document = (Path(__file__).parent.parent / "docs" / "errors.md").read_text()
    keys: dict[str, set[str]] = {}
    for line in document.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) < 6 or not re.fullmatch(r"`[A-Z_]+`", cells[1]):
            continue
        keys[cells[1].strip("`")] = set(re.findall(r"`([a-z_]+)`", cells[4]))
    return keys


def test_every_reason_has_one_typed_error_whose_fields_are_its_documented_metadata() -> None:
    classes = _error_classes()
    assert set(classes) == set(Reason)
    documented = _documented_metadata_keys()
    for reason, cls in classes.items():
        names = {field.name for field in dataclasses.fields(cls)} - {"message"}
        # One field stands for a key the class attribute `reason` already names.
        names = {"reason" if name == "reason_name" else name for name in names}
        assert names == documented[reason.value], reason


def test_a_typed_errors_metadata_is_its_fields_as_strings() -> None:
    error = errors.ContextBudgetExceeded(
        "too large",
        estimated_tokens=1,
        full_estimated_tokens=2,
        context_window_tokens=3,
        output_reserve_tokens=4,
        budget_tokens=5,
    )
    assert error.metadata == {
        "estimated_tokens": "1",
        "full_estimated_tokens": "2",
        "context_window_tokens": "3",
        "output_reserve_tokens": "4",
        "budget_tokens": "5",
    }
    assert str(error) == "too large"
    assert errors.CommandNotAllowed("no", command="x").metadata == {"command": "x"}
    assert errors.CommandNotAllowed("no", command="x", env="PATH").metadata == {
        "command": "x",
        "env": "PATH",
    }
    assert errors.ConnectionAuthorizationRequired(
        "sign in", connection="c", reason_name="NEVER_SIGNED_IN"
    ).metadata == {"connection": "c", "reason": "NEVER_SIGNED_IN"}
    assert errors.storage_unavailable("locked").retry_delay_seconds == 0.5
    assert errors.field_invalid("a", "b").retry_delay_seconds is None

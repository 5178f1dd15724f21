"""The Python contract runner: every scenario of tests/contract/scenarios/ through the
generated Python stubs, against a sidecar process, over a Unix socket and loopback TCP."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status

import psych.sidecar.v1
from tests.contract.python.engine import (
    CALL_TIMEOUT_SECONDS,
    ErrorDetail,
    Outcome,
    ScenarioError,
    load_scenario,
    run_scenario,
    scenario_files,
)


def _contract_services() -> dict[str, tuple[ServiceDescriptor, type[Any]]]:
    """Every service of psych.sidecar.v1 with its generated stub class."""
    services = {}
    package = psych.sidecar.v1
    for module_info in pkgutil.iter_modules(package.__path__):
        if not module_info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        for name, service in module.DESCRIPTOR.services_by_name.items():
            stubs = importlib.import_module(f"{module.__name__}_grpc")
            services[name] = (service, getattr(stubs, f"{name}Stub"))
    return services


SERVICES = _contract_services()


class GeneratedStubs:
    """Makes a scenario step's call through the generated stub of its service."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stubs = {name: (service, stub(channel)) for name, (service, stub) in SERVICES.items()}

    def invoke(self, call: str, request: dict[str, Any]) -> Outcome:
        service_name, _, method_name = call.partition(".")
        if service_name not in self._stubs:
            raise ScenarioError(f"no service {service_name} in the contract")
        service, stub = self._stubs[service_name]
        method = service.methods_by_name.get(method_name)
        if method is None:
            raise ScenarioError(f"no method {method_name} in {service_name}")
        message = message_factory.GetMessageClass(method.input_type)()
        try:
            json_format.ParseDict(request, message)
        except json_format.ParseError as error:
            raise ScenarioError(f"request is not a {method.input_type.name}: {error}") from None
        try:
            response: Message = getattr(stub, method_name)(message, timeout=CALL_TIMEOUT_SECONDS)
        except grpc.RpcError as error:
            return _failure(error)
        return Outcome(response=json_format.MessageToDict(response))


def _failure(error: Any) -> Outcome:
    status = rpc_status.from_call(error)
    details: list[ErrorDetail | None] = []
    for detail in status.details if status is not None else []:
        info = error_details_pb2.ErrorInfo()
        details.append(
            ErrorDetail(info.reason, info.domain, dict(info.metadata))
            if detail.Unpack(info)
            else None
        )
    return Outcome(code=error.code().name, message=error.details() or "", details=details)


@pytest.mark.parametrize("path", scenario_files(), ids=lambda path: path.stem)
def test_scenario(
    path: Path, grpc_channel: grpc.Channel, scenario_passed: Callable[[], None]
) -> None:
    run_scenario(load_scenario(path), GeneratedStubs(grpc_channel).invoke)
    scenario_passed()

"""The client: a channel, the generated stubs on it, deadlines, typed errors, append retries."""

from __future__ import annotations

import os
import stat
import time
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from psych.sidecar.v1 import (
    connection_service_pb2_grpc,
    errors_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_service_pb2_grpc,
    tool_service_pb2_grpc,
    turn_service_pb2_grpc,
    usage_service_pb2_grpc,
)

DEFAULT_READY_TIMEOUT_SECONDS = 20.0
DEFAULT_CALL_TIMEOUT_SECONDS = 10.0
DEFAULT_APPEND_ATTEMPTS = 3
# The sidecar's own default limit: prompts and tool results outgrow gRPC's 4 MiB default.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Failures after which the append may or may not have been stored: retried with its request id.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_ERROR_DOMAIN = "psych.sidecar.v1"
_REASON_PREFIX = "ERROR_REASON_"
_RETRY_BACKOFF_SECONDS = 0.1

RequestT = TypeVar("RequestT", bound=Message)
ResponseT = TypeVar("ResponseT", bound=Message)


class SidecarError(Exception):
    """A failed call. Switch on `reason`, a generated ErrorReason value
    (`ErrorReason.ERROR_REASON_RUN_NOT_FOUND`, ...): it is ERROR_REASON_UNSPECIFIED when the
    error carries no ErrorInfo (gRPC's own failures: UNAVAILABLE, DEADLINE_EXCEEDED, ...)
    or a reason newer than this client's stubs (`reason_name` still holds it)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason_name: str = "",
        metadata: dict[str, str] | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}" + (f" ({reason_name})" if reason_name else ""))
        self.code = code
        self.message = message
        self.reason_name = reason_name
        self.metadata = metadata or {}
        # Seconds the sidecar advises waiting before a retry (its google.rpc.RetryInfo).
        self.retry_delay = retry_delay
        known = _REASON_PREFIX + reason_name in errors_pb2.ErrorReason.keys()  # noqa: SIM118
        self.reason: errors_pb2.ErrorReason.ValueType = (
            errors_pb2.ErrorReason.Value(_REASON_PREFIX + reason_name)
            if reason_name and known
            else errors_pb2.ERROR_REASON_UNSPECIFIED
        )

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> SidecarError:
        """The sidecar's single ErrorInfo, decoded; any other failure keeps its code only."""
        call: Any = error
        status = rpc_status.from_call(call)
        found: error_details_pb2.ErrorInfo | None = None
        retry_delay: float | None = None
        for detail in status.details if status is not None else []:
            info = error_details_pb2.ErrorInfo()
            retry = error_details_pb2.RetryInfo()
            if detail.Unpack(info) and info.domain == _ERROR_DOMAIN:
                found = info
            elif detail.Unpack(retry):
                retry_delay = retry.retry_delay.ToNanoseconds() / 1e9
        if found is not None and status is not None:
            return cls(call.code(), status.message, found.reason, dict(found.metadata), retry_delay)
        return cls(call.code(), call.details() or "")


class SidecarClient:
    """The generated stubs of every service on one channel, plus `call` and `append_records`."""

    def __init__(
        self, channel: grpc.Channel, *, call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS
    ) -> None:
        self.channel = channel
        self.call_timeout = call_timeout
        self.specs = spec_service_pb2_grpc.SpecServiceStub(channel)
        self.runs = run_service_pb2_grpc.RunServiceStub(channel)
        self.connections = connection_service_pb2_grpc.ConnectionServiceStub(channel)
        self.turns = turn_service_pb2_grpc.TurnServiceStub(channel)
        self.tools = tool_service_pb2_grpc.ToolServiceStub(channel)
        self.usage = usage_service_pb2_grpc.UsageServiceStub(channel)

    def call(
        self,
        method: grpc.UnaryUnaryMultiCallable[RequestT, ResponseT],
        request: RequestT,
        *,
        timeout: float | None = None,
    ) -> ResponseT:
        """One call through a generated stub method, e.g. `call(client.runs.GetRun, request)`,
        with a deadline (`timeout`, else the client's call_timeout); raises SidecarError."""
        try:
            return method(request, timeout=self.call_timeout if timeout is None else timeout)
        except grpc.RpcError as error:
            raise SidecarError.from_rpc_error(error) from error

    def append_records(
        self,
        request: run_service_pb2.AppendRecordsRequest,
        *,
        attempts: int = DEFAULT_APPEND_ATTEMPTS,
        timeout: float | None = None,
    ) -> run_service_pb2.AppendRecordsResponse:
        """AppendRecords, retried up to `attempts` times in all on UNAVAILABLE (including the
        sidecar's STORAGE_UNAVAILABLE, after its advised delay) or DEADLINE_EXCEEDED with the
        same request id (a fresh one when the request has none):
        the sidecar stores the records once and answers every attempt with the first answer."""
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        if not request.request_id:
            with_id = run_service_pb2.AppendRecordsRequest()
            with_id.CopyFrom(request)
            with_id.request_id = uuid.uuid4().hex
            request = with_id
        for attempt in range(1, attempts + 1):
            try:
                return self.call(self.runs.AppendRecords, request, timeout=timeout)
            except SidecarError as error:
                if error.code not in RETRYABLE_CODES or attempt == attempts:
                    raise
                delay = max(_RETRY_BACKOFF_SECONDS * 2 ** (attempt - 1), error.retry_delay or 0)
            time.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    address: str,
    *,
    ready_timeout: float = DEFAULT_READY_TIMEOUT_SECONDS,
    call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    interceptors: Sequence[grpc.UnaryUnaryClientInterceptor] = (),
) -> SidecarClient:
    """Dial `address` — `unix:///absolute.sock`, `unix:relative.sock` or `HOST:PORT`, as the
    sidecar's --listen takes them — and wait until it reports SERVING, for at most
    `ready_timeout` seconds (TimeoutError otherwise). Before it waits, a Unix socket must be
    there (FileNotFoundError otherwise) and the address well-formed (ValueError otherwise):
    either says at once which path it looked at."""
    check_address(address)
    channel = grpc.insecure_channel(
        address,
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ],
    )
    if interceptors:
        channel = grpc.intercept_channel(channel, *interceptors)
    try:
        _wait_serving(channel, address, ready_timeout)
    except BaseException:
        channel.close()
        raise
    return SidecarClient(channel, call_timeout=call_timeout)


def check_address(address: str) -> None:
    """What is wrong with `address`, at once: a `unix:` socket that is not there (or is not a
    socket), or a socket path written without `unix:`. A TCP address is only tried."""
    if not address:
        raise ValueError(
            "no sidecar address: give the one scripts/serve prints "
            "(unix:/…/psych-sidecar-data/sidecar.sock)"
        )
    if not address.startswith("unix:"):
        if "://" not in address and (
            address.startswith(("/", ".", "~"))
            or address.endswith(".sock")
            or ("/" in address and ":" not in address)
        ):
            raise ValueError(
                f"{address} is a socket path without unix: in front: write unix:{address}"
            )
        return
    path = os.path.abspath(address.removeprefix("unix:").removeprefix("//"))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        directory = os.path.dirname(path)
        why = (
            "is the sidecar running, and listening there?"
            if os.path.isdir(directory)
            else f"the directory {directory} does not exist"
        )
        raise FileNotFoundError(f"no socket at {path} (from {address}): {why}") from None
    if not stat.S_ISSOCK(mode):
        raise ValueError(f"{path} (from {address}) is not a socket")


def _wait_serving(channel: grpc.Channel, address: str, ready_timeout: float) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + ready_timeout
    last = "no answer"
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=min(remaining, 1.0))
            if status.status == health_pb2.HealthCheckResponse.SERVING:
                return
            last = health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)
        except grpc.RpcError as error:
            last = error.code().name
        time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
    raise TimeoutError(f"psych-sidecar at {address} not SERVING within {ready_timeout} s ({last})")

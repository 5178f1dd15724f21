"""The RPC wrapper every call goes through: request size limit and decoding, one ErrorInfo per
error, the call's metric, span and log context, UNIMPLEMENTED for an RPC a servicer lacks, and
the in-flight calls that shutdown answers when its grace ends."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor, message_factory
from google.protobuf.message import DecodeError, Message

from psych_sidecar.api.errors import STATUS_CODES, abort
from psych_sidecar.api.plumbing import Context, Serialized, serialize_response
from psych_sidecar.domain.errors import (
    InternalError,
    MessageTooLarge,
    NotImplementedHere,
    ShuttingDown,
    SidecarError,
    field_invalid,
)
from psych_sidecar.telemetry import logs, metrics, tracing

log = logging.getLogger(__name__)

# gRPC sets SO_REUSEPORT by default, so a second sidecar on a TCP port would silently share
# it with the first; without it, the second one fails to start instead.
NO_REUSEPORT = ("grpc.so_reuseport", 0)

Behaviour = Callable[[Any, Context], Awaitable[Message | Serialized]]


@dataclass(frozen=True, slots=True)
class _Rejected:
    """Stands in for a request refused while deserializing, so the handler can answer it
    with a proper ErrorInfo instead of the transport's bare status."""

    error: SidecarError


@dataclass(frozen=True, slots=True)
class Binding:
    """A service of the contract and its servicer. An RPC the servicer has no method of its
    own for (one added to the contract before its behaviour) answers UNIMPLEMENTED with
    NOT_IMPLEMENTED rather than failing the server's start."""

    servicer: object
    service: descriptor.ServiceDescriptor


def _deserializer(message_class: type[Message], limit: int) -> Callable[[bytes], object]:
    def deserialize(data: bytes) -> object:
        if len(data) > limit:
            return _Rejected(
                MessageTooLarge(
                    f"request of {len(data)} bytes exceeds the limit of {limit} bytes",
                    limit_bytes=limit,
                    size_bytes=len(data),
                )
            )
        try:
            return message_class.FromString(data)
        except DecodeError as error:
            return _Rejected(
                field_invalid("request", f"not a valid {message_class.__name__}: {error}")
            )

    return deserialize


def _unimplemented(method: str) -> Behaviour:
    async def behaviour(request: Any, context: Context) -> Message:
        raise NotImplementedHere(f"{method} is not implemented in this release", method=method)

    return behaviour


class InFlight:
    """The calls being handled, and shutdown as a call sees it. Every call that arrives after
    shutdown began is answered UNAVAILABLE / SHUTTING_DOWN with its ErrorInfo; never a bare
    CANCELLED, which is what gRPC gives a call still queued (received, not yet handed to a
    handler) when the server stops. So the server stops only once nothing is queued:

    1. draining (`settle`): a call that arrives is answered at once; those already running get
       the grace, and those still running when it ends are cut short and answered;
    2. closing (`quiesce`): a call that arrives is held, so its client (which waits for the
       answer) sends nothing more, until no call has arrived for a moment;
    3. the server stops (no call is queued: every one that came is held in a handler), then
       `release` answers the held calls. A call after that meets the stopped listener and
       gets gRPC's own bare UNAVAILABLE.
    """

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.shutting_down: SidecarError | None = None
        self._refused: SidecarError | None = None
        self._holding = False
        self._released = asyncio.Event()
        self._last_arrival = -math.inf

    async def settle(self, grace_seconds: float) -> None:
        """Wait up to the grace for in-flight calls, then cut the rest short."""
        self.shutting_down = ShuttingDown(
            f"the sidecar is shutting down; the call did not finish within {grace_seconds:g} s",
            grace_seconds=grace_seconds,
        )
        self._refused = ShuttingDown(
            "the sidecar is shutting down and takes no new calls; retry on another sidecar "
            "or after the restart",
            grace_seconds=grace_seconds,
        )
        waiting = set(self.tasks)
        if waiting:
            await asyncio.wait(waiting, timeout=grace_seconds)
        for task in waiting:
            task.cancel()
        if waiting:
            await asyncio.wait(waiting, timeout=5)

    async def refuse(self) -> None:
        """Answer a call that arrived after shutdown began (see the class): raises
        SHUTTING_DOWN, at once while draining, once released while closing."""
        assert self._refused is not None, "only after settle() began"
        self._last_arrival = asyncio.get_running_loop().time()
        if self._holding:
            await self._released.wait()
        raise self._refused

    async def quiesce(self, quiet_seconds: float, longest_seconds: float) -> None:
        """Hold arriving calls until none has arrived for `quiet_seconds` (at most
        `longest_seconds`): then no call is left queued for a handler."""
        self._holding = True
        loop = asyncio.get_running_loop()
        # A call queued now is unseen until its handler starts: quiet is counted from here.
        self._last_arrival = max(self._last_arrival, loop.time())
        deadline = loop.time() + longest_seconds
        while (now := loop.time()) < deadline:
            quiet_until = self._last_arrival + quiet_seconds
            if now >= quiet_until:
                return
            await asyncio.sleep(min(quiet_until, deadline) - now)

    def release(self) -> None:
        """Answer the held calls (the server has stopped taking calls)."""
        self._released.set()


def _log_fields(request_class: type[Message], service: str) -> list[tuple[str, str]]:
    """(log field, request field) pairs this method's requests carry: the Run id, tenant
    and connection a log line of the call is about."""
    present = {field.name for field in request_class.DESCRIPTOR.fields}
    connection = "name" if service.endswith("ConnectionService") else "server"
    pairs = [("run_id", "run_id"), ("tenant", "tenant"), ("connection", connection)]
    return [(log_field, field) for log_field, field in pairs if field in present]


def _guarded(
    method: str,
    behaviour: Behaviour,
    log_fields: Sequence[tuple[str, str]] = (),
    in_flight: InFlight | None = None,
) -> Behaviour:
    """Every RPC goes through here: one ErrorInfo per error, no stack trace to the client;
    its metric, its span (continuing the caller's traceparent) and its log context. A call
    still running when shutdown's grace ends is answered UNAVAILABLE / SHUTTING_DOWN."""

    label = method.lstrip("/")
    tracked = in_flight or InFlight()

    async def handle(request: Any, context: Context) -> Message | Serialized:
        started = time.perf_counter()
        code = grpc.StatusCode.UNKNOWN
        fields = {"rpc": label}
        if not isinstance(request, _Rejected):
            for name, field in log_fields:
                value = getattr(request, field)
                if value:
                    fields[name] = value
        bound = logs.bind_call(fields)
        span = tracing.start_rpc(method, context.invocation_metadata)
        failure: SidecarError | None = None
        task = asyncio.current_task()
        assert task is not None
        tracked.tasks.add(task)
        try:
            if tracked.shutting_down is not None:
                await tracked.refuse()
            if isinstance(request, _Rejected):
                raise request.error
            response = await behaviour(request, context)
            code = grpc.StatusCode.OK
        except SidecarError as error:
            code = STATUS_CODES[error.reason]
            failure = error
        except asyncio.CancelledError:
            if tracked.shutting_down is None:
                code = grpc.StatusCode.CANCELLED
                raise  # the client cancelled, or its deadline passed: nobody to answer
            code = grpc.StatusCode.UNAVAILABLE
            failure = tracked.shutting_down
        except Exception:
            code = grpc.StatusCode.INTERNAL
            correlation_id = uuid.uuid4().hex
            log.exception(
                "unexpected error in %s, correlation id %s",
                method,
                correlation_id,
                extra={"correlation_id": correlation_id},
            )
            failure = InternalError(
                f"internal error, correlation id {correlation_id}",
                correlation_id=correlation_id,
            )
        finally:
            tracked.tasks.discard(task)
            # Recorded before the answer leaves: a client that saw it finds it counted.
            elapsed = time.perf_counter() - started
            metrics.record_rpc(label, code.name, elapsed)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s answered %s in %.2f ms", label, code.name, elapsed * 1000)
            tracing.end_rpc(span, code.name, code.value[0])
            logs.unbind(bound)
        if failure is not None:
            await abort(context, failure)
        return response

    return handle


def _own_method(servicer: object, name: str) -> Behaviour | None:
    """The servicer's method for an RPC, or None when it has none of its own: the generated
    base class's stand-in (which raises NotImplementedError, an INTERNAL error here) does not
    count."""
    behaviour = getattr(servicer, name, None)
    if behaviour is None or getattr(behaviour, "__module__", "").endswith("_pb2_grpc"):
        return None
    return behaviour  # type: ignore[no-any-return]


def _generic_handler(binding: Binding, limit: int, in_flight: InFlight) -> grpc.GenericRpcHandler:
    handlers = {}
    for method in binding.service.methods:
        assert not method.client_streaming, "the contract has only unary RPCs"
        assert not method.server_streaming, "the contract has only unary RPCs"
        full_name = f"/{binding.service.full_name}/{method.name}"
        # A servicer may define only some of its service's RPCs; the rest are UNIMPLEMENTED.
        behaviour = _own_method(binding.servicer, method.name) or _unimplemented(full_name)
        request_class = message_factory.GetMessageClass(method.input_type)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _guarded(
                full_name,
                behaviour,
                _log_fields(request_class, binding.service.full_name),
                in_flight,
            ),
            request_deserializer=_deserializer(request_class, limit),
            response_serializer=serialize_response,
        )
    return grpc.method_handlers_generic_handler(binding.service.full_name, handlers)


def rpc_server(bindings: Sequence[Binding], limit: int, in_flight: InFlight) -> grpc.aio.Server:
    """A gRPC server with every binding's RPCs wrapped, each request held to `limit` bytes."""
    # The transport admits up to twice the limit so that a request over the limit reaches the
    # handler and gets MESSAGE_TOO_LARGE with an ErrorInfo; beyond that the transport itself
    # refuses it with a bare RESOURCE_EXHAUSTED.
    transport_limit = min(2 * limit, 2**31 - 1)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", transport_limit),
            ("grpc.max_send_message_length", transport_limit),
            NO_REUSEPORT,
        ]
    )
    server.add_generic_rpc_handlers([_generic_handler(b, limit, in_flight) for b in bindings])
    return server

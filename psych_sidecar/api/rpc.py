"""The contract's services on a gRPC server: each servicer registered with its generated
`add_*Servicer_to_server` (`bind`: mypy holds the servicer to its generated base), and every
call through one chain of interceptors, one concern each, ordered in `interceptors`: the
answer of an error (status and one ErrorInfo), the span, the log context, the metric,
unexpected errors and RPCs a servicer lacks, shutdown's in-flight calls, and the request's
size limit and decoding.

Interceptors rather than one hand-written wrapper, by measurement: the sidecar's server CPU
per GetRun (8,000 calls a round, 6 rounds alternating with the one wrapper this chain
replaced, both sidecars on one CPU) was 0.98x the wrapper's with metrics and tracing off and
1.00x with metrics and tracing at 0.1; in process, the chain costs ~2 µs a call more (5.8
against 3.8 µs of CPU, of a GetRun's ~360 µs). Each concern wraps a method's handler once,
at its first call, and the outermost keeps the result: a call costs one interceptor look-up
and one coroutine frame per concern. What did cost was the generated functions' second
registration, as registered methods (see `_GenericHandlersOnly`).
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

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

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)

# gRPC sets SO_REUSEPORT by default, so a second sidecar on a TCP port would silently share
# it with the first; without it, the second one fails to start instead.
NO_REUSEPORT = ("grpc.so_reuseport", 0)

Behaviour = Callable[[Any, Context], Awaitable[Message | Serialized]]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
S = TypeVar("S")
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
_State = TypeVar("_State")


@dataclass(frozen=True, slots=True)
class Binding:
    """A service of the contract (its descriptor: its name and requests, for reflection,
    health and the chain) and the registration of its servicer. Made by `bind`."""

    service: descriptor.ServiceDescriptor
    register: Callable[[grpc.aio.Server], None]


def bind(
    servicer: S,
    register: Callable[[S, grpc.aio.Server], None],
    service: descriptor.ServiceDescriptor,
) -> Binding:
    """`servicer` registered with `register`, the service's generated
    `add_*Servicer_to_server`: mypy then holds the servicer to the generated `*Servicer`
    base, so its class must implement every RPC with the contract's types."""
    return Binding(service, functools.partial(register, servicer))


@dataclass(frozen=True, slots=True)
class _Rejected:
    """Stands in for a request refused while deserializing, so the handler can answer it
    with a proper ErrorInfo instead of the transport's bare status."""

    error: SidecarError


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
        """Hold arriving calls until none has arrived for `quiet_seconds` of the event loop
        being free (at most `longest_seconds`): then no call is left queued for a handler.

        The quiet is watched in steps of a tenth of it. A step that overslept by more than
        its own length means the loop (or the whole process) was held up, and a call queued
        meanwhile may not have reached its handler yet: the quiet starts again."""
        self._holding = True
        loop = asyncio.get_running_loop()
        # A call queued now is unseen until its handler starts: quiet is counted from here.
        self._last_arrival = max(self._last_arrival, loop.time())
        deadline = loop.time() + longest_seconds
        step = quiet_seconds / 10
        while (now := loop.time()) < deadline:
            quiet_until = self._last_arrival + quiet_seconds
            if now >= quiet_until:
                return
            wanted = min(quiet_until, deadline, now + step) - now
            await asyncio.sleep(wanted)
            woke = loop.time()
            if woke - now > wanted + step:
                self._last_arrival = max(self._last_arrival, woke)

    def release(self) -> None:
        """Answer the held calls (the server has stopped taking calls)."""
        self._released.set()


class _Concern(grpc.aio.ServerInterceptor):
    """One cross-cutting concern of the contract's RPCs: `wrap` gives a method's behaviour
    with the concern around it, once per method, at its first call. Other services' calls
    (health, reflection) and unknown methods pass through as they are."""

    def __init__(self, methods: Mapping[str, descriptor.MethodDescriptor]) -> None:
        self._methods = methods
        self._handlers: dict[str, Handler] = {}

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Request, _Response] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Request, _Response] | None:
        name = handler_call_details.method
        handler: Handler | None = self._handlers.get(name)
        if handler is not None:
            return handler
        handler = await continuation(handler_call_details)
        method = self._methods.get(name)
        if handler is None or method is None:
            return handler
        handler = self._handlers[name] = self.rewrite(method, handler)
        return handler

    def rewrite(self, method: descriptor.MethodDescriptor, handler: Handler) -> Handler:
        """The handler with its behaviour wrapped, its (de)serializers as they were."""
        return grpc.unary_unary_rpc_method_handler(
            self.wrap(method, cast(Behaviour, handler.unary_unary)),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    @abc.abstractmethod
    def wrap(self, method: descriptor.MethodDescriptor, behaviour: Behaviour) -> Behaviour:
        """`behaviour` with this concern around it."""


def _full_name(method: descriptor.MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


class _AnswerErrors(_Concern):
    """A SidecarError becomes the call's status with exactly one ErrorInfo (and RetryInfo
    when it advises a delay); no stack trace reaches the client. Outermost: every other
    concern has seen the error before the answer leaves."""

    def wrap(self, method: descriptor.MethodDescriptor, behaviour: Behaviour) -> Behaviour:
        async def answer_errors(request: Any, context: Context) -> Message | Serialized:
            try:
                return await behaviour(request, context)
            except SidecarError as error:
                await abort(context, error)

        return answer_errors


def _code_of(error: BaseException) -> grpc.StatusCode:
    """The status a call that raised `error` ends with (errors are SidecarErrors here)."""
    if isinstance(error, SidecarError):
        return STATUS_CODES[error.reason]
    if isinstance(error, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED  # the client cancelled, or its deadline passed
    return grpc.StatusCode.UNKNOWN


def _ended(
    behaviour: Behaviour,
    begin: Callable[[Context], _State],
    end: Callable[[_State, grpc.StatusCode], None],
) -> Behaviour:
    """`behaviour` between `begin` and `end`, which is told the status the call ends with."""

    async def ended(request: Any, context: Context) -> Message | Serialized:
        state = begin(context)
        code = grpc.StatusCode.OK
        try:
            return await behaviour(request, context)
        except BaseException as error:
            code = _code_of(error)
            raise
        finally:
            end(state, code)

    return ended


class _Span(_Concern):
    """The call's span, continuing the caller's traceparent, current while it runs."""

    def wrap(self, method: descriptor.MethodDescriptor, behaviour: Behaviour) -> Behaviour:
        name = _full_name(method)

        def begin(context: Context) -> tuple[Span, object] | None:
            return tracing.start_rpc(name, context.invocation_metadata)

        def end(span: tuple[Span, object] | None, code: grpc.StatusCode) -> None:
            tracing.end_rpc(span, code.name, code.value[0])

        return _ended(behaviour, begin, end)


class _LogContext(_Concern):
    """The call's log fields: its RPC, and the Run id, tenant and connection its request
    names."""

    def wrap(self, method: descriptor.MethodDescriptor, behaviour: Behaviour) -> Behaviour:
        label = _full_name(method).lstrip("/")
        present = {field.name for field in method.input_type.fields}
        connection = "name" if method.containing_service.name == "ConnectionService" else "server"
        pairs = [("run_id", "run_id"), ("tenant", "tenant"), ("connection", connection)]
        log_fields = [(log_field, field) for log_field, field in pairs if field in present]

        async def in_log_context(request: Any, context: Context) -> Message | Serialized:
            fields = {"rpc": label}
            if not isinstance(request, _Rejected):
                for name, field in log_fields:
                    value = getattr(request, field)
                    if value:
                        fields[name] = value
            bound = logs.bind_call(fields)
            try:
                return await behaviour(request, context)
            finally:
                logs.unbind(bound)

        return in_log_context


class _Timing(_Concern):
    """The call's metric (by method and status code), recorded before the answer leaves, so a
    client that saw the answer finds it counted; and its answered line at DEBUG."""

    def wrap(self, method: descriptor.MethodDescriptor, behaviour: Behaviour) -> Behaviour:
        label = _full_name(method).lstrip("/")

        def begin(context: Context) -> float:
            return time.perf_counter()

        def end(started: float, code: grpc.StatusCode) -> None:
            elapsed = time.perf_counter() - started
            metrics.record_rpc(label, code.name, elapsed)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s answered %s in %.2f ms", label, code.name, elapsed * 1000)

        return _ended(behaviour, begin, end)


class _UnexpectedErrors(_Concern):
    """Any other exception is INTERNAL with a correlation id, logged with its stack; an RPC
    the servicer has no method of its own for (one added to the contract before its
    behaviour) is UNIMPLEMENTED / NOT_IMPLEMENTED: the generated base class's stand-in sets
    UNIMPLEMENTED and raises NotImplementedError."""

    def wrap(self, method: descriptor.MethodDescriptor, behaviour: Behaviour) -> Behaviour:
        name = _full_name(method)

        async def expected(request: Any, context: Context) -> Message | Serialized:
            try:
                return await behaviour(request, context)
            except SidecarError:
                raise
            except Exception as error:
                if (
                    isinstance(error, NotImplementedError)
                    and context.code() == grpc.StatusCode.UNIMPLEMENTED
                ):
                    raise NotImplementedHere(
                        f"{name} is not implemented in this release",
                        method=name,
                    ) from None
                correlation_id = uuid.uuid4().hex
                log.exception(
                    "unexpected error in %s, correlation id %s",
                    name,
                    correlation_id,
                    extra={"correlation_id": correlation_id},
                )
                raise InternalError(
                    f"internal error, correlation id {correlation_id}",
                    correlation_id=correlation_id,
                ) from None

        return expected


class _Shutdown(_Concern):
    """The call is tracked in flight; after shutdown began it is refused, and one still
    running when the grace ends is answered UNAVAILABLE / SHUTTING_DOWN (see InFlight)."""

    def __init__(
        self, methods: Mapping[str, descriptor.MethodDescriptor], in_flight: InFlight
    ) -> None:
        super().__init__(methods)
        self._in_flight = in_flight

    def wrap(self, method: descriptor.MethodDescriptor, behaviour: Behaviour) -> Behaviour:
        tracked = self._in_flight

        async def in_flight(request: Any, context: Context) -> Message | Serialized:
            task = asyncio.current_task()
            assert task is not None
            tracked.tasks.add(task)
            try:
                if tracked.shutting_down is not None:
                    await tracked.refuse()
                return await behaviour(request, context)
            except asyncio.CancelledError:
                if tracked.shutting_down is None:
                    raise  # the client cancelled, or its deadline passed: nobody to answer
                raise tracked.shutting_down from None
            finally:
                tracked.tasks.discard(task)

        return in_flight


class _RequestLimit(_Concern):
    """A request over `limit` bytes, or one that does not decode, is answered with an
    ErrorInfo (MESSAGE_TOO_LARGE, FIELD_INVALID) by the handler, not refused bare by the
    transport; a response a servicer serialized itself (`Serialized`) passes through."""

    def __init__(self, methods: Mapping[str, descriptor.MethodDescriptor], limit: int) -> None:
        super().__init__(methods)
        self._limit = limit

    def rewrite(self, method: descriptor.MethodDescriptor, handler: Handler) -> Handler:
        return grpc.unary_unary_rpc_method_handler(
            self.wrap(method, cast(Behaviour, handler.unary_unary)),
            request_deserializer=_deserializer(
                message_factory.GetMessageClass(method.input_type), self._limit
            ),
            response_serializer=serialize_response,
        )

    def wrap(self, method: descriptor.MethodDescriptor, behaviour: Behaviour) -> Behaviour:
        async def decoded(request: Any, context: Context) -> Message | Serialized:
            if isinstance(request, _Rejected):
                raise request.error
            return await behaviour(request, context)

        return decoded


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


def interceptors(
    services: Sequence[descriptor.ServiceDescriptor], limit: int, in_flight: InFlight
) -> list[grpc.aio.ServerInterceptor]:
    """The chain every call of `services` goes through, outermost first: a call meets them in
    this order, its answer (or error) in the reverse."""
    methods = {_full_name(method): method for service in services for method in service.methods}
    assert not any(m.client_streaming or m.server_streaming for m in methods.values()), (
        "the contract has only unary RPCs"
    )
    return [
        _AnswerErrors(methods),
        _Span(methods),
        _LogContext(methods),
        _Timing(methods),
        _UnexpectedErrors(methods),
        _Shutdown(methods, in_flight),
        _RequestLimit(methods, limit),
    ]


def rpc_server(bindings: Sequence[Binding], limit: int, in_flight: InFlight) -> grpc.aio.Server:
    """A gRPC server with every binding's servicer registered and its calls through the
    chain (`interceptors`), each request held to `limit` bytes."""
    # The transport admits up to twice the limit so that a request over the limit reaches the
    # handler and gets MESSAGE_TOO_LARGE with an ErrorInfo; beyond that the transport itself
    # refuses it with a bare RESOURCE_EXHAUSTED.
    transport_limit = min(2 * limit, 2**31 - 1)
    server = grpc.aio.server(
        interceptors=interceptors([b.service for b in bindings], limit, in_flight),
        options=[
            ("grpc.max_receive_message_length", transport_limit),
            ("grpc.max_send_message_length", transport_limit),
            NO_REUSEPORT,
        ],
    )
    for binding in bindings:
        binding.register(cast(grpc.aio.Server, _GenericHandlersOnly(server)))
    return server


class _GenericHandlersOnly:
    """The server as a generated `add_*Servicer_to_server` sees it: its handlers are taken as
    a generic handler, and their copy as registered methods is dropped. For every call it
    accepts, grpc.aio's server waits anew on one future per registered method
    (`asyncio.wait` over all of them): with the contract's 30 methods a GetRun cost the
    sidecar ~8 % more CPU (~30 µs) than with none registered."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: object) -> None:
        pass

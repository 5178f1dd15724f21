"""The grpc.aio server: service registration, health, reflection, limits and graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor, message_factory
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from psych.sidecar.v1 import (
    connection_service_pb2,
    run_service_pb2,
    spec_service_pb2,
    tool_service_pb2,
    turn_service_pb2,
    usage_service_pb2,
)
from psych_sidecar.api.connections import ConnectionServicer
from psych_sidecar.api.errors import abort
from psych_sidecar.api.servicers import (
    Blocking,
    RunServicer,
    SpecServicer,
)
from psych_sidecar.api.tools import ToolServicer
from psych_sidecar.api.turns import TurnServicer
from psych_sidecar.api.usage import UsageServicer
from psych_sidecar.config import ListenAddress, Settings
from psych_sidecar.domain.calls import DispatchService, ToolExecutor, ToolOutputReader
from psych_sidecar.domain.catalog import CatalogTool
from psych_sidecar.domain.errors import Reason, SidecarError, field_invalid
from psych_sidecar.domain.prompt import PromptAssembler, SpecLookup
from psych_sidecar.domain.runlog import RunService, SpecService
from psych_sidecar.domain.surface import TurnResolver
from psych_sidecar.domain.usage import UsageService
from psych_sidecar.mcp.manager import McpManager
from psych_sidecar.mcp.service import ConnectionService
from psych_sidecar.search.encoder import tool_embeddings
from psych_sidecar.storage.connections import SqlConnectionStore
from psych_sidecar.storage.db import create_database_engine, migrate
from psych_sidecar.storage.log_reads import SqlLogReader
from psych_sidecar.storage.repository import SqlStore
from psych_sidecar.storage.usage import SqlUsageStore

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
Behaviour = Callable[[Any, Context], Awaitable[Message]]


@dataclass(frozen=True, slots=True)
class _Rejected:
    """Stands in for a request refused while deserializing, so the handler can answer it
    with a proper ErrorInfo instead of the transport's bare status."""

    error: SidecarError


@dataclass(frozen=True, slots=True)
class _Binding:
    """A service of the contract and its servicer. An RPC the servicer has no method for
    (one added to the contract before its behaviour) answers UNIMPLEMENTED with
    NOT_IMPLEMENTED rather than failing the server's start."""

    servicer: object
    service: descriptor.ServiceDescriptor


def _deserializer(message_class: type[Message], limit: int) -> Callable[[bytes], object]:
    def deserialize(data: bytes) -> object:
        if len(data) > limit:
            return _Rejected(
                SidecarError(
                    Reason.MESSAGE_TOO_LARGE,
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
        raise SidecarError(
            Reason.NOT_IMPLEMENTED, f"{method} is not implemented in this release", method=method
        )

    return behaviour


class InFlight:
    """The calls being handled, so that shutdown can answer those still running when the
    grace ends with UNAVAILABLE / SHUTTING_DOWN instead of a bare CANCELLED."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.shutting_down: SidecarError | None = None

    async def settle(self, grace_seconds: float) -> None:
        """Wait up to the grace for in-flight calls, then cut the rest short."""
        self.shutting_down = SidecarError(
            Reason.SHUTTING_DOWN,
            f"the sidecar is shutting down; the call did not finish within {grace_seconds:g} s",
            grace_seconds=grace_seconds,
        )
        waiting = set(self.tasks)
        if waiting:
            await asyncio.wait(waiting, timeout=grace_seconds)
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=5)


def _guarded(method: str, behaviour: Behaviour, in_flight: InFlight) -> Behaviour:
    """Every RPC goes through here: one ErrorInfo per error, no stack trace to the client."""

    async def handle(request: Any, context: Context) -> Message:
        if isinstance(request, _Rejected):
            await abort(context, request.error)
        task = asyncio.current_task()
        assert task is not None
        in_flight.tasks.add(task)
        try:
            return await behaviour(request, context)
        except SidecarError as error:
            await abort(context, error)
        except asyncio.CancelledError:
            if in_flight.shutting_down is None:
                raise  # the client cancelled, or its deadline passed: nobody to answer
            await abort(context, in_flight.shutting_down)
        except Exception:
            correlation_id = uuid.uuid4().hex
            log.exception("unexpected error in %s, correlation id %s", method, correlation_id)
            await abort(
                context,
                SidecarError(
                    Reason.INTERNAL,
                    f"internal error, correlation id {correlation_id}",
                    correlation_id=correlation_id,
                ),
            )
        finally:
            in_flight.tasks.discard(task)

    return handle


def _generic_handler(binding: _Binding, limit: int, in_flight: InFlight) -> grpc.GenericRpcHandler:
    handlers = {}
    for method in binding.service.methods:
        assert not method.client_streaming, "the contract has only unary RPCs"
        assert not method.server_streaming, "the contract has only unary RPCs"
        full_name = f"/{binding.service.full_name}/{method.name}"
        # A servicer may define only some of its service's RPCs; the rest are UNIMPLEMENTED.
        behaviour = getattr(binding.servicer, method.name, None) or _unimplemented(full_name)
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _guarded(full_name, behaviour, in_flight),
            request_deserializer=_deserializer(request_class, limit),
            response_serializer=response_class.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(binding.service.full_name, handlers)


def _prepare_unix_socket(path: str) -> None:
    """Create the socket's directory and clear a stale socket left by a crashed sidecar,
    refusing to take over one that a live process still answers on."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise RuntimeError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
    else:
        raise RuntimeError(f"another process is already serving on {path}")
    finally:
        probe.close()


class Sidecar:
    """One running sidecar: storage, domain services and the gRPC server around them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._addresses = settings.listen_addresses()
        self._engine = create_database_engine(
            settings.resolved_database_url(),
            pool_size=settings.worker_threads,
            busy_timeout_seconds=settings.database_busy_timeout_seconds,
        )
        self._executor = ThreadPoolExecutor(
            max_workers=settings.worker_threads, thread_name_prefix="storage"
        )
        # CPU-heavy steps (search, schema validation) get their own threads: a burst of index
        # builds must not hold every database worker.
        self._cpu_executor = ThreadPoolExecutor(
            max_workers=settings.cpu_threads, thread_name_prefix="cpu"
        )
        self._health = health.aio.HealthServicer()
        self._connection_store = SqlConnectionStore(self._engine)
        # Sentence vectors for tool search (None: keywords only), shared by every Run.
        self._embeddings = tool_embeddings(settings.semantic_search)
        # The MCP layer: one session per connection. It is the CatalogView and the
        # ToolRunner of domain/catalog/connections.py. Each listing it stores is encoded for search
        # in the background, so the first search does not pay for it.
        self.mcp = McpManager(
            self._connection_store,
            Blocking(self._executor),
            settings,
            on_listed=self._warm_search if self._embeddings is not None else None,
        )
        self.catalog = self.mcp
        self.tool_runner = self.mcp
        self._in_flight = InFlight()
        # The turn resolver, once the services are bound (its caches are inspectable).
        self.resolver: TurnResolver | None = None
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self.bound: list[str] = []
        self.health_bound: list[str] = []

    def _bindings(self) -> list[_Binding]:
        store = SqlStore(self._engine)
        log = SqlLogReader(self._engine)
        blocking = Blocking(self._executor)
        limit = self.settings.max_message_bytes
        runs = RunService(store, store)
        resolver = TurnResolver(
            runs,
            store,
            self.catalog,
            embeddings=self._embeddings,
            search_index_cache_bytes=self.settings.search_index_cache_bytes,
            resolution_cache_bytes=self.settings.resolution_cache_bytes,
        )
        self.resolver = resolver
        executor = ToolExecutor(
            resolver,
            runs,
            self.tool_runner,
            blocking,
            self.settings.tool_call_timeout_seconds,
            log=log,
            cpu=Blocking(self._cpu_executor),
        )
        specs = SpecLookup(store)
        reader = ToolOutputReader(runs, log)
        return [
            _Binding(
                SpecServicer(SpecService(store), blocking),
                spec_service_pb2.DESCRIPTOR.services_by_name["SpecService"],
            ),
            _Binding(
                RunServicer(runs, blocking, limit),
                run_service_pb2.DESCRIPTOR.services_by_name["RunService"],
            ),
            _Binding(
                ConnectionServicer(
                    ConnectionService(self.mcp, self._connection_store, blocking), limit
                ),
                connection_service_pb2.DESCRIPTOR.services_by_name["ConnectionService"],
            ),
            _Binding(
                TurnServicer(
                    resolver,
                    PromptAssembler(runs, specs, log, resolver.resolve_turn),
                    blocking,
                    limit,
                ),
                turn_service_pb2.DESCRIPTOR.services_by_name["TurnService"],
            ),
            _Binding(
                ToolServicer(
                    resolver,
                    executor,
                    reader,
                    DispatchService(runs, specs, log, reader),
                    blocking,
                    limit,
                    cpu=Blocking(self._cpu_executor),
                ),
                tool_service_pb2.DESCRIPTOR.services_by_name["ToolService"],
            ),
            _Binding(
                UsageServicer(UsageService(runs, SqlUsageStore(self._engine)), blocking),
                usage_service_pb2.DESCRIPTOR.services_by_name["UsageService"],
            ),
        ]

    async def start(self) -> None:
        if self.settings.migrate_on_start:
            await asyncio.get_running_loop().run_in_executor(self._executor, migrate, self._engine)
        await self.mcp.start()
        limit = self.settings.max_message_bytes
        # The transport admits up to twice the limit so that a request over the limit
        # reaches the handler and gets MESSAGE_TOO_LARGE with an ErrorInfo; beyond that
        # the transport itself refuses it with a bare RESOURCE_EXHAUSTED.
        transport_limit = min(2 * limit, 2**31 - 1)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", transport_limit),
                ("grpc.max_send_message_length", transport_limit),
            ]
        )
        bindings = self._bindings()
        server.add_generic_rpc_handlers(
            [_generic_handler(b, limit, self._in_flight) for b in bindings]
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        service_names = [b.service.full_name for b in bindings]
        reflection.enable_server_reflection(
            [
                *service_names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            server,
        )
        for address in self._addresses:
            self.bound.append(self._bind(server, address))
        await server.start()
        self._server = server
        self._restrict_sockets(self._addresses)
        if self.settings.health_listen:
            # Health only, so a probe port on the pod IP exposes nothing else; it shares the
            # servicer, so it turns NOT_SERVING with the API on shutdown.
            health_server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(self._health, health_server)
            for address in self.settings.health_listen_addresses():
                self.health_bound.append(self._bind(health_server, address))
            await health_server.start()
            self._health_server = health_server
            self._restrict_sockets(self.settings.health_listen_addresses())
        for name in ["", *service_names]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("psych-sidecar serving on %s", ", ".join(self.bound))
        if self.health_bound:
            log.info("health only on %s", ", ".join(self.health_bound))

    def _restrict_sockets(self, addresses: list[ListenAddress]) -> None:
        for address in addresses:
            if address.unix_path is not None:
                os.chmod(address.unix_path, self.settings.unix_socket_mode)

    @staticmethod
    def _bind(server: grpc.aio.Server, address: ListenAddress) -> str:
        if address.unix_path is not None:
            _prepare_unix_socket(address.unix_path)
        port = server.add_insecure_port(address.grpc_target)
        if address.unix_path is not None:
            return address.grpc_target
        return ListenAddress(host=address.host, port=port).grpc_target

    def _warm_search(self, tools: Sequence[CatalogTool]) -> None:
        if self._embeddings is not None:
            self._embeddings.warm_in_background([(t.name, t.description) for t in tools])

    async def stop(self) -> None:
        """NOT_SERVING first, then stop taking calls and let in-flight ones finish; those
        still running when the grace ends are answered UNAVAILABLE / SHUTTING_DOWN."""
        await self._health.enter_graceful_shutdown()
        if self.settings.drain_delay_seconds:
            await asyncio.sleep(self.settings.drain_delay_seconds)
        if self._server is not None:
            grace = self.settings.shutdown_grace_seconds
            # New calls are refused at once (bare UNAVAILABLE); in-flight ones get the grace,
            # and an answer of ours when it ends, before the transport would cancel them.
            stopping = asyncio.ensure_future(self._server.stop(grace + 5))
            await self._in_flight.settle(grace)
            await stopping
        if self._health_server is not None:
            await self._health_server.stop(None)
        await self.mcp.stop()
        if self._embeddings is not None:
            self._embeddings.close()
        self._executor.shutdown(wait=True)
        self._cpu_executor.shutdown(wait=True)
        self._engine.dispose()
        for address in [*self._addresses, *self.settings.health_listen_addresses()]:
            if address.unix_path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(address.unix_path)


async def serve(settings: Settings) -> None:
    sidecar = Sidecar(settings)
    await sidecar.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    log.info("signal received: reporting NOT_SERVING and draining in-flight calls")
    await sidecar.stop()
    log.info("psych-sidecar stopped")

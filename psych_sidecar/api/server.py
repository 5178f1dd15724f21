"""The grpc.aio server: service registration, health, reflection, limits and graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import stat
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor, message_factory
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.sdk.trace import TracerProvider

from psych.sidecar.v1 import (
    connection_service_pb2,
    run_service_pb2,
    spec_service_pb2,
    tool_service_pb2,
    turn_service_pb2,
    usage_service_pb2,
)
from psych_sidecar.api.connections import ConnectionServicer
from psych_sidecar.api.errors import STATUS_CODES, abort
from psych_sidecar.api.servicers import (
    Blocking,
    RunServicer,
    Serialized,
    SpecServicer,
    serialize_response,
)
from psych_sidecar.api.tools import ToolServicer
from psych_sidecar.api.turns import TurnServicer
from psych_sidecar.api.usage import UsageServicer
from psych_sidecar.config import ListenAddress, Settings
from psych_sidecar.domain.calls import ToolOutputReader, ToolRouter
from psych_sidecar.domain.catalog import CatalogTool, ConnectionService
from psych_sidecar.domain.errors import Reason, SidecarError, field_invalid
from psych_sidecar.domain.inspect import RunInspector
from psych_sidecar.domain.prompt import PromptAssembler
from psych_sidecar.domain.runlog import RunService, SpecLookup, SpecService
from psych_sidecar.domain.surface import TurnResolver
from psych_sidecar.domain.usage import UsageService
from psych_sidecar.mcp.manager import McpManager
from psych_sidecar.search import EmbeddingCounters
from psych_sidecar.search.encoder import tool_embeddings
from psych_sidecar.storage.connections import SqlConnectionStore
from psych_sidecar.storage.db import (
    DatabaseRefused,
    check_writable_values,
    create_database_engine,
    migrate,
)
from psych_sidecar.storage.journal import SqlAssemblyJournal
from psych_sidecar.storage.log_reads import SqliteTurnStartsNow, SqlLogReader
from psych_sidecar.storage.repository import SqlStore
from psych_sidecar.storage.search_vectors import SqlVectorStore
from psych_sidecar.storage.usage import SqlUsageStore
from psych_sidecar.telemetry import logs, metrics, tracing

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from psych_sidecar.admin import AdminServer

log = logging.getLogger(__name__)

# gRPC sets SO_REUSEPORT by default, so a second sidecar on a TCP port would silently share
# it with the first; without it, the second one fails to start instead.
_NO_REUSEPORT = ("grpc.so_reuseport", 0)
# See serve().
_GIL_SWITCH_INTERVAL_SECONDS = 0.001

Context = grpc.aio.ServicerContext[Any, Any]
Behaviour = Callable[[Any, Context], Awaitable[Message | Serialized]]


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
            fields.update((name, getattr(request, field)) for name, field in log_fields)
        bound = logs.bind(**fields)
        span = tracing.start_rpc(method, context.invocation_metadata)
        failure: SidecarError | None = None
        task = asyncio.current_task()
        assert task is not None
        tracked.tasks.add(task)
        try:
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
            failure = SidecarError(
                Reason.INTERNAL,
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


def _generic_handler(binding: _Binding, limit: int, in_flight: InFlight) -> grpc.GenericRpcHandler:
    handlers = {}
    for method in binding.service.methods:
        assert not method.client_streaming, "the contract has only unary RPCs"
        assert not method.server_streaming, "the contract has only unary RPCs"
        full_name = f"/{binding.service.full_name}/{method.name}"
        # A servicer may define only some of its service's RPCs; the rest are UNIMPLEMENTED.
        behaviour = getattr(binding.servicer, method.name, None) or _unimplemented(full_name)
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


class StartupError(Exception):
    """An expected reason the sidecar cannot start (another sidecar on its socket, a port in
    use): the command prints it as one line and exits 1, without a traceback."""


def _prepare_unix_socket(path: str) -> None:
    """Create the socket's directory and clear a stale socket left by a crashed sidecar,
    refusing to take over one that a live process still answers on."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise StartupError(f"cannot listen on unix:{path}: the file exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        # Nobody accepts there: the file of a sidecar that did not stop cleanly.
        os.unlink(path)
        log.info("removed the stale socket file %s", path)
    except OSError as error:
        raise StartupError(f"cannot listen on unix:{path}: {error.strerror}") from error
    else:
        raise StartupError(
            f"another sidecar is already serving on unix:{path}; "
            "stop it first, or give this one another listen address"
        )
    finally:
        probe.close()


def _check_tcp_port(address: ListenAddress) -> None:
    """Refuse a TCP address another process listens on, before anything else starts (gRPC
    would otherwise log its own error, or share the port with SO_REUSEPORT)."""
    if address.port == 0:
        return
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(address.host, address.port, family, socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise StartupError(f"cannot listen on {address.grpc_target}: {error.strerror}") from error
    for *_, sockaddr in infos:
        probe = socket.socket(family, socket.SOCK_STREAM)
        # As gRPC binds: a port whose old connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as error:
            raise StartupError(
                f"cannot listen on {address.grpc_target}: {error.strerror}"
            ) from error
        finally:
            probe.close()


def check_listeners(settings: Settings) -> None:
    """Fail early, with a StartupError, when a listen address is taken: before migrations run
    and before any session starts. A stale socket file is removed."""
    for address in [*settings.listen_addresses(), *settings.health_listen_addresses()]:
        if address.unix_path is not None:
            _prepare_unix_socket(address.unix_path)
        else:
            _check_tcp_port(address)
    for address in settings.admin_listen_addresses():
        if address.unix_path is None:
            _check_tcp_port(address)


class Sidecar:
    """One running sidecar: storage, domain services and the gRPC server around them."""

    def __init__(self, settings: Settings, tracer_provider: TracerProvider | None = None) -> None:
        """`tracer_provider` overrides the one `settings.tracing` would build (tests export
        to memory with it)."""
        self.settings = settings
        self._tracer_provider = tracer_provider
        self._owns_tracer_provider = False
        self._addresses = settings.listen_addresses()
        self._engine = create_database_engine(
            settings.resolved_database_url(),
            pool_size=settings.worker_threads,
            busy_timeout_seconds=settings.database_busy_timeout_seconds,
        )
        # SQLite answers the turn-start read of ResolveTurn on the loop when it need not wait.
        self._turn_starts_now = (
            SqliteTurnStartsNow(self._engine) if self._engine.dialect.name == "sqlite" else None
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
        # Sentence vectors for tool search (None: keywords only), shared by every Run, and
        # through the database by every sidecar on it.
        self._embeddings = tool_embeddings(settings.semantic_search, SqlVectorStore(self._engine))
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
        # One row of metadata per AssemblePrompt, for the Run inspector (None: turned off).
        self.journal = (
            SqlAssemblyJournal(self._engine, settings.assembly_journal_retention_hours * 3600)
            if settings.assembly_journal
            else None
        )
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self.bound: list[str] = []
        self.health_bound: list[str] = []
        # Socket files this sidecar bound, and so removes on stop (never another's).
        self._socket_files: list[str] = []
        self.admin: AdminServer | None = None
        self._inspector: RunInspector | None = None
        self._unwatch: Callable[[], None] | None = None
        self._loop_lag: asyncio.Task[None] | None = None

    def _admin_routes(self) -> list[BaseRoute]:
        """Everything the admin listener serves; a module serving a page there adds its
        `admin_routes(...)` here."""
        assert self._inspector is not None, "routes are built after the bindings"
        # Imported only with the admin listener on: uvicorn and the inspector's templates are
        # a fifth of a start's imports.
        from psych_sidecar.admin import ui

        return [
            *metrics.admin_routes(),
            *ui.admin_routes(
                self._inspector, Blocking(self._executor), self.settings.admin_ui_allow_remote
            ),
        ]

    def _bindings(self) -> list[_Binding]:
        store = SqlStore(self._engine)
        log = SqlLogReader(self._engine)
        blocking = Blocking(self._executor)
        limit = self.settings.max_message_bytes
        runs = RunService(store, store)
        specs = SpecLookup(store)
        resolver = TurnResolver(
            runs,
            specs,
            self.catalog,
            log,
            embeddings=self._embeddings,
            pins=store,
            log_now=self._turn_starts_now,
            search_index_cache_bytes=self.settings.search_index_cache_bytes,
            resolution_cache_bytes=self.settings.resolution_cache_bytes,
        )
        self.resolver = resolver
        reader = ToolOutputReader(runs, log)
        router = ToolRouter(
            resolver,
            runs,
            log,
            self.tool_runner,
            reader,
            blocking,
            self.settings.tool_call_timeout_seconds,
            cpu=Blocking(self._cpu_executor),
        )
        self._inspector = RunInspector(
            runs,
            log,
            self.journal,
            SqlUsageStore(self._engine),
            reader,
            self.catalog,
            self._connection_store,
        )
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
                    PromptAssembler(runs, specs, log, resolver, journal=self.journal),
                    blocking,
                    limit,
                ),
                turn_service_pb2.DESCRIPTOR.services_by_name["TurnService"],
            ),
            _Binding(
                ToolServicer(
                    resolver,
                    router,
                    reader,
                    blocking,
                    limit,
                    inline_result_bytes=self.settings.inline_result_bytes,
                    grep_threads=self.settings.worker_threads // 2,
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
        if self.settings.admin_listen:
            # Before anything that records (the MCP sessions' first listings).
            metrics.enable()
        if self._tracer_provider is None and self.settings.tracing == "otlp":
            self._tracer_provider = tracing.otlp_provider()
            self._owns_tracer_provider = True
        if self._tracer_provider is not None:
            tracing.install(self._tracer_provider)
        loop = asyncio.get_running_loop()
        if self.settings.migrate_on_start:
            await loop.run_in_executor(self._executor, migrate, self._engine)
        try:
            await loop.run_in_executor(self._executor, check_writable_values, self._engine)
        except DatabaseRefused as error:
            raise StartupError(str(error)) from None
        await self.mcp.start()
        if self._embeddings is not None:
            # The model loads in the background from the start (`serve` began it beside the
            # imports: search.encoder.preload), so a restarted sidecar ranks its stored
            # catalogues by meaning as soon as it serves.
            self._embeddings.prepare()
        limit = self.settings.max_message_bytes
        # The transport admits up to twice the limit so that a request over the limit
        # reaches the handler and gets MESSAGE_TOO_LARGE with an ErrorInfo; beyond that
        # the transport itself refuses it with a bare RESOURCE_EXHAUSTED.
        transport_limit = min(2 * limit, 2**31 - 1)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", transport_limit),
                ("grpc.max_send_message_length", transport_limit),
                _NO_REUSEPORT,
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
        credentials = self._tls_credentials()
        for address in self._addresses:
            self.bound.append(self._bind(server, address, credentials))
            if credentials is None and not address.is_loopback:
                log.warning(
                    "serving plaintext, unauthenticated gRPC on the non-loopback address %s "
                    "(insecure_non_loopback): anyone who reaches it can use every RPC; "
                    "configure tls_cert_file and tls_key_file (and tls_client_ca_file)",
                    address.grpc_target,
                )
        await server.start()
        self._server = server
        self._restrict_sockets(self._addresses)
        if self.settings.health_listen:
            # Health only, so a probe port on the pod IP exposes nothing else; it shares the
            # servicer, so it turns NOT_SERVING with the API on shutdown.
            health_server = grpc.aio.server(options=[_NO_REUSEPORT])
            health_pb2_grpc.add_HealthServicer_to_server(self._health, health_server)
            for address in self.settings.health_listen_addresses():
                self.health_bound.append(self._bind(health_server, address))
            await health_server.start()
            self._health_server = health_server
            self._restrict_sockets(self.settings.health_listen_addresses())
        if self.settings.admin_listen:
            from psych_sidecar.admin import AdminServer

            self.admin = AdminServer(self.settings.admin_listen_addresses(), self._admin_routes())
            await self.admin.start()
            self._unwatch = metrics.watch(self)
            self._loop_lag = asyncio.create_task(metrics.watch_loop_lag())
        for name in ["", *service_names]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("psych-sidecar serving on %s", ", ".join(self.bound))
        if self.health_bound:
            log.info("health only on %s", ", ".join(self.health_bound))

    def _restrict_sockets(self, addresses: list[ListenAddress]) -> None:
        for address in addresses:
            if address.unix_path is not None:
                os.chmod(address.unix_path, self.settings.unix_socket_mode)

    def _tls_credentials(self) -> grpc.ServerCredentials | None:
        """TLS for the TCP API listeners, when configured: the server's certificate, and
        client certificates required when a client CA is given (mutual TLS)."""
        files = self.settings.tls_files()
        if files is None:
            return None
        cert_file, key_file, client_ca_file = files
        client_ca = client_ca_file.read_bytes() if client_ca_file is not None else None
        return grpc.ssl_server_credentials(
            [(key_file.read_bytes(), cert_file.read_bytes())],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )

    def _bind(
        self,
        server: grpc.aio.Server,
        address: ListenAddress,
        credentials: grpc.ServerCredentials | None = None,
    ) -> str:
        """Unix sockets are pod-local and file-permission guarded: never TLS. TCP listeners
        serve TLS when `credentials` are given."""
        if address.unix_path is not None:
            _prepare_unix_socket(address.unix_path)
        try:
            if address.unix_path is None and credentials is not None:
                port = server.add_secure_port(address.grpc_target, credentials)
            else:
                port = server.add_insecure_port(address.grpc_target)
        except RuntimeError as error:
            raise StartupError(f"cannot listen on {address.grpc_target}: {error}") from error
        if address.unix_path is not None:
            self._socket_files.append(address.unix_path)
            return address.grpc_target
        return ListenAddress(host=address.host, port=port).grpc_target

    # metrics.StateSource: read at every scrape.

    def connection_states(self) -> list[tuple[str, str]]:
        return self.mcp.connection_states()

    def catalog_sizes(self) -> list[tuple[str, int]]:
        return self.mcp.catalog_sizes()

    def warmup_backlog(self) -> int:
        """Texts queued for the search warm-up and not encoded or read yet."""
        return self._embeddings.counters().backlog if self._embeddings is not None else 0

    @property
    def search_counters(self) -> EmbeddingCounters | None:
        """What tool search's embeddings did in this process (None: semantic search off)."""
        return None if self._embeddings is None else self._embeddings.counters()

    def _warm_search(self, tools: Sequence[CatalogTool]) -> None:
        if self._embeddings is not None:
            self._embeddings.warm_in_background([(t.name, t.description) for t in tools])

    async def stop(self) -> None:
        """NOT_SERVING first, then stop taking calls and let in-flight ones finish; those
        still running when the grace ends are answered UNAVAILABLE / SHUTTING_DOWN."""
        await self._health.enter_graceful_shutdown()
        if self.settings.drain_delay_seconds and self._server is not None:
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
        if self.admin is not None:
            await self.admin.stop()
        if self._unwatch is not None:
            self._unwatch()
        if self._loop_lag is not None:
            self._loop_lag.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_lag
        await self.mcp.stop()
        if self._embeddings is not None:
            # Waits for the warm-up chunk under way (within one chunk of encoding): it writes
            # to the database, so before disposing, and nothing is logged after "stopped".
            await asyncio.to_thread(self._embeddings.close, True)
            done = self._embeddings.counters()
            log.info(
                "search vectors this run: %d texts encoded, %d queries encoded, %d read from "
                "the database, %d written, %d collected",
                done.texts_encoded,
                done.queries_encoded,
                done.vectors_read,
                done.vectors_written,
                done.vectors_collected,
            )
        self._executor.shutdown(wait=True)
        self._cpu_executor.shutdown(wait=True)
        if self._turn_starts_now is not None:
            self._turn_starts_now.close()
        self._engine.dispose()
        if self._tracer_provider is not None:
            tracing.uninstall()
            if self._owns_tracer_provider:
                self._tracer_provider.shutdown()
        for path in self._socket_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


async def serve(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT. StartupError: an expected reason not to start."""
    check_listeners(settings)
    sidecar = Sidecar(settings)
    try:
        await sidecar.start()
    except BaseException:
        await sidecar.stop()
        raise
    # What start-up made (modules, the contract's descriptors, schemas, servers, pools) lives
    # as long as the process: kept out of the cyclic collector's sight, a full collection no
    # longer walks ~200k permanent objects. On a busy sidecar one full collection otherwise
    # held the GIL for ~100 ms, stalling the loop.
    gc.freeze()
    # A thread wanting the GIL waits this long before asking the holder to let go (CPython's
    # default: 5 ms). The event loop answers calls while worker threads convert and store
    # large results; each of its turns may wait once, so 5 ms made a health check 12-17 ms
    # beside 50 MB results landing, 1 ms made it ~8 ms (loop_stall_ratio), for no measurable
    # change in calls/s (rpc_overhead_ratio, resolve_turn_overhead_ratio).
    sys.setswitchinterval(_GIL_SWITCH_INTERVAL_SECONDS)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    log.info("signal received: reporting NOT_SERVING and draining in-flight calls")
    await sidecar.stop()
    log.info("psych-sidecar stopped")

"""One running sidecar: its object graph (:mod:`.graph`) behind the gRPC API, the health and
admin listeners; start, TLS, and graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from psych_sidecar.api.rpc import NO_REUSEPORT, InFlight, rpc_server
from psych_sidecar.app import process
from psych_sidecar.app.graph import SidecarGraph
from psych_sidecar.app.retention import expire_runs_periodically
from psych_sidecar.app.secret_keys import check_stored_secrets
from psych_sidecar.config import ListenAddress, Settings
from psych_sidecar.domain.calls import ToolOutputReader
from psych_sidecar.listeners import (
    StartupError,
    check_listeners,
    prepare_unix_socket,
    remove_unix_sockets,
    restrict_unix_sockets,
)
from psych_sidecar.mcp.command_check import commands_that_cannot_start
from psych_sidecar.search import EmbeddingCounters
from psych_sidecar.storage.migrate import DatabaseRefused, check_writable_values
from psych_sidecar.telemetry import metrics, tracing

if TYPE_CHECKING:
    import mcp_types
    from opentelemetry.sdk.trace import TracerProvider
    from starlette.routing import BaseRoute

    from psych_sidecar.admin import AdminServer
    from psych_sidecar.domain.catalog import McpToolResult

__all__ = ["Sidecar", "StartupError", "serve"]

log = logging.getLogger(__name__)

# Shutdown (InFlight): the server stops once no call has arrived for _QUIET_SECONDS of the
# loop being free (a queued call reaches its handler within milliseconds of the loop being
# free; a stall of the loop starts the quiet again), or after _LONGEST_QUIESCE_SECONDS of calls
# arriving regardless; the held calls are answered at once, and the backstop only bounds the
# server's own stop.
_QUIET_SECONDS = 0.1
_LONGEST_QUIESCE_SECONDS = 2.0
_STOP_BACKSTOP_SECONDS = 5.0


class Sidecar:
    """One running sidecar: storage, domain services and the gRPC server around them."""

    def __init__(
        self,
        settings: Settings,
        tracer_provider: TracerProvider | None = None,
        convert_tool_result: Callable[[mcp_types.CallToolResult], McpToolResult] | None = None,
    ) -> None:
        """`tracer_provider` overrides the one the `tracing` setting would build (tests export
        to memory with it); `convert_tool_result` how a tool result becomes what the log keeps
        (tests pass one that fails, standing in for a bug)."""
        self.settings = settings
        self._tracer_provider = tracer_provider
        self._owns_tracer_provider = False
        self._addresses = settings.listen_addresses()
        self.graph = SidecarGraph(settings, convert_tool_result)
        self._health = health.aio.HealthServicer()
        self.mcp = self.graph.mcp
        self.catalog = self.graph.catalog
        self.tool_runner = self.graph.tool_runner
        # The turn resolver (its caches are inspectable) and the assembly journal.
        self.resolver = self.graph.resolver
        self.journal = self.graph.journal
        self._in_flight = InFlight()
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self.bound: list[str] = []
        self.health_bound: list[str] = []
        # Socket files this sidecar bound, and so removes on stop (never another's).
        self._socket_files: list[str] = []
        self.admin: AdminServer | None = None
        self._unwatch: Callable[[], None] | None = None
        self._loop_lag: asyncio.Task[None] | None = None
        self._retention: asyncio.Task[None] | None = None
        self._forgetting: asyncio.Task[None] | None = None
        self._task_polls: asyncio.Task[None] | None = None

    def _admin_routes(self) -> list[BaseRoute]:
        """Everything the admin listener serves; a module serving a page there adds its
        `admin_routes(...)` here."""
        # Imported only with the admin listener on: uvicorn and the inspector's templates are
        # a fifth of a start's imports.
        from psych_sidecar.admin import ui

        return [
            *metrics.admin_routes(),
            *ui.admin_routes(
                self.graph.inspector, self.graph.blocking, self.settings.admin.ui_allow_remote
            ),
        ]

    async def start(self) -> None:
        if self.settings.admin.listen:
            # Before anything that records (the MCP sessions' first listings).
            metrics.enable()
        if self._tracer_provider is None and self.settings.telemetry.tracing == "otlp":
            self._tracer_provider = tracing.otlp_provider(
                self.settings.telemetry.tracing_sample_ratio
            )
            self._owns_tracer_provider = True
        if self._tracer_provider is not None:
            tracing.install(self._tracer_provider)
        loop = asyncio.get_running_loop()
        graph = self.graph
        if self.settings.storage.migrate_on_start:
            await loop.run_in_executor(graph.executor, graph.migrate)
        await loop.run_in_executor(graph.executor, check_stored_secrets, graph.connection_store)
        try:
            await loop.run_in_executor(graph.executor, check_writable_values, graph.engine)
        except DatabaseRefused as error:
            raise StartupError(str(error)) from None
        for name, problem in commands_that_cannot_start(self.settings.mcp.commands).items():
            log.warning("the stdio MCP command %s cannot start: %s", name, problem)
        await self.mcp.start()
        bindings = graph.bindings
        server = rpc_server(bindings, self.settings.listeners.max_message_bytes, self._in_flight)
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
        restrict_unix_sockets(self._addresses, self.settings.listeners.unix_socket_mode)
        if self.settings.listeners.health_listen:
            # Health only, so a probe port on the pod IP exposes nothing else; it shares the
            # servicer, so it turns NOT_SERVING with the API on shutdown.
            health_server = grpc.aio.server(options=[NO_REUSEPORT])
            health_pb2_grpc.add_HealthServicer_to_server(self._health, health_server)
            for address in self.settings.health_listen_addresses():
                self.health_bound.append(self._bind(health_server, address))
            await health_server.start()
            self._health_server = health_server
            restrict_unix_sockets(
                self.settings.health_listen_addresses(), self.settings.listeners.unix_socket_mode
            )
        if self.settings.admin.listen:
            from psych_sidecar.admin import AdminServer

            self.admin = AdminServer(
                self.settings.admin_listen_addresses(),
                self._admin_routes(),
                self.settings.listeners.unix_socket_mode,
            )
            await self.admin.start()
            self._unwatch = metrics.watch(self)
            self._loop_lag = asyncio.create_task(metrics.watch_loop_lag())
        # Tool calls running as tasks, this sidecar's or another's on the database.
        self._task_polls = asyncio.create_task(graph.tasks.poll_forever())
        retention_hours = self.settings.storage.run_retention_hours
        if retention_hours > 0:
            self._retention = asyncio.create_task(
                expire_runs_periodically(
                    graph.deletion, graph.blocking, timedelta(hours=retention_hours)
                )
            )
        self._forgetting = asyncio.create_task(forget_unused_parsed_results(graph.reader))
        for name in ["", *service_names]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if graph.embeddings is not None:
            # The model loads on a thread of its own once the API answers (memory-mapped from
            # its prepared copy: a fraction of a second), so a restarted sidecar ranks its
            # stored catalogues by meaning soon after it serves, and never serves later for it.
            graph.embeddings.prepare()
        log.info("psych-sidecar serving on %s", ", ".join(self.bound))
        if self.health_bound:
            log.info("health only on %s", ", ".join(self.health_bound))

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
            prepare_unix_socket(address.unix_path)
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
        embeddings = self.graph.embeddings
        return embeddings.counters().backlog if embeddings is not None else 0

    @property
    def search_counters(self) -> EmbeddingCounters | None:
        """What tool search's embeddings did in this process (None: semantic search off)."""
        embeddings = self.graph.embeddings
        return None if embeddings is None else embeddings.counters()

    async def stop(self) -> None:
        """NOT_SERVING first, then refuse new calls and let in-flight ones finish; those
        still running when the grace ends are answered UNAVAILABLE / SHUTTING_DOWN, and the
        listeners stop once no call is queued."""
        await self._health.enter_graceful_shutdown()
        if self.settings.listeners.drain_delay_seconds and self._server is not None:
            await asyncio.sleep(self.settings.listeners.drain_delay_seconds)
        if self._server is not None:
            # New calls are answered SHUTTING_DOWN; in-flight ones get the grace, and an
            # answer of ours when it ends. The server stops once no call is queued (see
            # InFlight): gRPC cancels a queued call, bare, when it stops.
            await self._in_flight.settle(self.settings.listeners.shutdown_grace_seconds)
            await self._in_flight.quiesce(_QUIET_SECONDS, _LONGEST_QUIESCE_SECONDS)
            stopping = asyncio.ensure_future(self._server.stop(_STOP_BACKSTOP_SECONDS))
            # Its first step (no new call is taken; clients are told to go away) runs before
            # it first waits: then the held calls are answered.
            await asyncio.sleep(0)
            self._in_flight.release()
            await stopping
        if self._health_server is not None:
            await self._health_server.stop(None)
        if self.admin is not None:
            await self.admin.stop()
        if self._unwatch is not None:
            self._unwatch()
        # The background tasks, each ended before the next. A task poll cut short is polled
        # again (by any sidecar) when its claim runs out.
        for task in (self._loop_lag, self._retention, self._forgetting, self._task_polls):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.mcp.stop()
        embeddings = self.graph.embeddings
        if embeddings is not None:
            # Waits for the warm-up chunk under way (within one chunk of encoding): it writes
            # to the database, so before disposing, and nothing is logged after "stopped".
            await asyncio.to_thread(embeddings.close, True)
            done = embeddings.counters()
            log.info(
                "search vectors this run: %d texts encoded, %d queries encoded, %d read from "
                "the database, %d written, %d collected",
                done.texts_encoded,
                done.queries_encoded,
                done.vectors_read,
                done.vectors_written,
                done.vectors_collected,
            )
        self.graph.close()
        if self._tracer_provider is not None:
            tracing.uninstall()
            if self._owns_tracer_provider:
                self._tracer_provider.shutdown()
        remove_unix_sockets(self._socket_files)


# How often forget_unused_parsed_results looks (a quarter of what a parsed result is kept).
_FORGET_PASS_SECONDS = 15.0


async def forget_unused_parsed_results(reader: ToolOutputReader) -> None:
    """Until cancelled: every few seconds, drop the results parsed for queries that no query
    used for a while (ToolOutputReader.forget_unused_parsed; a lock and a few entries)."""
    while True:
        await asyncio.sleep(_FORGET_PASS_SECONDS)
        reader.forget_unused_parsed()


async def serve(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT. StartupError: an expected reason not to start."""
    check_listeners(settings)
    sidecar = Sidecar(settings)
    try:
        await sidecar.start()
    except BaseException:
        await sidecar.stop()
        raise
    process.after_start()
    releasing = asyncio.create_task(process.release_kept_memory())
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    log.info("signal received: reporting NOT_SERVING and draining in-flight calls")
    releasing.cancel()
    await sidecar.stop()
    log.info("psych-sidecar stopped")

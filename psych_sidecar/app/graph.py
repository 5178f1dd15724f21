"""The one builder of the sidecar's object graph: storage, domain services, MCP sessions, search
and the servicers bound to the contract's services.

`build_sidecar` wires everything `serve` runs on; `open_database_reader` wires the same domain
services read-only, without sessions, for `psych-sidecar inspect --database-url`. Both go through
`_domain_services`, so a service gains a dependency in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine

from psych.sidecar.v1 import (
    connection_service_pb2,
    connection_service_pb2_grpc,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_service_pb2,
    spec_service_pb2_grpc,
    tool_service_pb2,
    tool_service_pb2_grpc,
    turn_service_pb2,
    turn_service_pb2_grpc,
    usage_service_pb2,
    usage_service_pb2_grpc,
)
from psych_sidecar.api.connections import ConnectionServicer
from psych_sidecar.api.plumbing import Blocking, LoopFirst
from psych_sidecar.api.rpc import bind
from psych_sidecar.api.runs import RunServicer
from psych_sidecar.api.specs import SpecServicer
from psych_sidecar.api.tools import ToolServicer
from psych_sidecar.api.turns import TurnServicer
from psych_sidecar.api.usage import UsageServicer
from psych_sidecar.app.secret_keys import load_secret_keys
from psych_sidecar.config import PromptSettings, SearchSettings, Settings
from psych_sidecar.domain.calls import ToolOutputReader, ToolRouter
from psych_sidecar.domain.catalog import (
    CatalogTool,
    CatalogView,
    ConnectionService,
    ConnectionSupervisor,
)
from psych_sidecar.domain.prompt import PromptAssembler
from psych_sidecar.domain.runlog import RunService, SpecLookup, SpecService
from psych_sidecar.domain.surface import TurnResolver
from psych_sidecar.domain.usage import UsageService
from psych_sidecar.mcp.manager import McpManager
from psych_sidecar.search import ToolEmbeddings
from psych_sidecar.search.model import tool_embeddings
from psych_sidecar.storage.connections import SqlConnectionStore
from psych_sidecar.storage.db import (
    NoWaitSqlite,
    create_database_engine,
    open_read_only,
    shared_reads,
)
from psych_sidecar.storage.journal import SqlAssemblyJournal
from psych_sidecar.storage.log_reads import NoWaitTurnStarts, SqlLogReader
from psych_sidecar.storage.oauth import SqlOAuthStore
from psych_sidecar.storage.repository import SqlStore, StoredSurfacePins
from psych_sidecar.storage.search_vectors import SqlVectorStore
from psych_sidecar.storage.usage import SqlUsageStore

if TYPE_CHECKING:
    from psych_sidecar.domain.inspect import RunInspector
    from psych_sidecar.domain.prompt import AssemblyJournal, TurnSurfaces
    from psych_sidecar.domain.runlog import NonWaitingTurnStarts, RunBlocking


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DomainServices:
    """The domain's use cases over one database."""

    store: SqlStore
    log: SqlLogReader
    connection_store: SqlConnectionStore
    runs: RunService
    specs: SpecLookup
    resolver: TurnResolver
    assembler: PromptAssembler
    connections: ConnectionService


def _domain_services(
    engine: Engine,
    catalog: CatalogView,
    supervisor: ConnectionSupervisor,
    blocking: RunBlocking,
    connection_store: SqlConnectionStore,
    *,
    search_index_cache_bytes: int,
    resolution_cache_bytes: int,
    live: bool,
    journal: AssemblyJournal | None = None,
    embeddings: ToolEmbeddings | None = None,
    log_now: NonWaitingTurnStarts | None = None,
) -> DomainServices:
    """`live`: sessions run and surfaces are pinned as turns resolve; otherwise a turn's surface
    and its servers' states are the stored pin's."""
    store = SqlStore(engine)
    log = SqlLogReader(engine)
    runs = RunService(store, store)
    specs = SpecLookup(store)
    resolver = TurnResolver(
        runs,
        specs,
        catalog,
        log,
        embeddings=embeddings,
        search_index_cache_bytes=search_index_cache_bytes,
        resolution_cache_bytes=resolution_cache_bytes,
        pins=store if live else StoredSurfacePins(engine),
        log_now=log_now,
    )
    if live:
        surfaces: TurnSurfaces = resolver
    else:
        from psych_sidecar.domain.inspect import PinnedStates

        surfaces = PinnedStates(resolver)
    assembler = PromptAssembler(runs, specs, log, surfaces, journal=journal)
    return DomainServices(
        store=store,
        log=log,
        connection_store=connection_store,
        runs=runs,
        specs=specs,
        resolver=resolver,
        assembler=assembler,
        connections=ConnectionService(supervisor, connection_store, blocking),
    )


class SidecarGraph:
    """Everything a serving sidecar runs on, built from its settings; `close` releases the
    thread pools and the database once nothing uses them."""

    def __init__(self, settings: Settings) -> None:
        self.engine = create_database_engine(
            settings.resolved_database_url(),
            pool_size=settings.storage.worker_threads,
            busy_timeout_seconds=settings.storage.database_busy_timeout_seconds,
        )
        self.executor = ThreadPoolExecutor(
            max_workers=settings.storage.worker_threads, thread_name_prefix="storage"
        )
        # CPU-heavy steps (search, schema validation) get their own threads: a burst of index
        # builds must not hold every database worker.
        self.cpu_executor = ThreadPoolExecutor(
            max_workers=settings.process.cpu_threads, thread_name_prefix="cpu"
        )
        self.blocking = Blocking(self.executor)
        cpu = Blocking(self.cpu_executor)
        # SQLite: a tool call's reads and a small result's append are tried on the event
        # loop's thread, over a connection that never waits, before a worker is asked.
        self.no_wait = (
            NoWaitSqlite(self.engine, background=self.executor.submit)
            if self.engine.dialect.name == "sqlite"
            else None
        )
        # SQLite answers the turn-start read of ResolveTurn on the loop when it need not wait.
        self.turn_starts_now = None if self.no_wait is None else NoWaitTurnStarts(self.no_wait)
        # Sentence vectors for tool search (None: keywords only), shared by every Run, and
        # through the database by every sidecar on it.
        self.embeddings = tool_embeddings(
            settings.search.semantic_search,
            SqlVectorStore(self.engine),
            settings.search.search_model_cache_dir,
            encode_threads=settings.process.cpu_threads,
        )
        # The MCP layer: one session per connection. It is the CatalogView, the
        # ConnectionSupervisor and the ToolRunner of domain/catalog. Each listing it stores is
        # encoded for search in the background, so the first search does not pay for it.
        self.secret_keys = load_secret_keys(settings)
        self.connection_store = connection_store = SqlConnectionStore(self.engine, self.secret_keys)
        self.mcp = McpManager(
            connection_store,
            self.blocking,
            settings.mcp,
            on_listed=self._warm_search if self.embeddings is not None else None,
            oauth=(settings.oauth, SqlOAuthStore(self.engine, self.secret_keys)),
        )
        # One row of metadata per AssemblePrompt, for the Run inspector (None: turned off).
        self.journal = (
            SqlAssemblyJournal(self.engine, settings.prompt.assembly_journal_retention_hours * 3600)
            if settings.prompt.assembly_journal
            else None
        )
        services = _domain_services(
            self.engine,
            self.mcp,
            self.mcp,
            self.blocking,
            connection_store,
            live=True,
            search_index_cache_bytes=settings.search.search_index_cache_bytes,
            resolution_cache_bytes=settings.prompt.resolution_cache_bytes,
            journal=self.journal,
            embeddings=self.embeddings,
            log_now=self.turn_starts_now,
        )
        self.resolver = services.resolver
        limit = settings.listeners.max_message_bytes
        reader = ToolOutputReader(services.runs, services.log)
        router = ToolRouter(
            services.resolver,
            services.runs,
            services.log,
            self.mcp,
            reader,
            self.blocking,
            settings.mcp.tool_call_timeout_seconds,
            cpu=cpu,
            one_read=lambda: shared_reads(self.engine),
            loop_first=None
            if self.no_wait is None
            else LoopFirst(self.blocking, self.no_wait.bound),
        )
        usage = SqlUsageStore(self.engine)

        # The Run inspector's use cases, for the admin listener's /ui only: built (and the
        # domain's inspect modules imported) when first asked for.
        def make_inspector() -> RunInspector:
            from psych_sidecar.domain.inspect import RunInspector

            return RunInspector(
                services.runs,
                services.log,
                self.journal,
                usage,
                reader,
                self.mcp,
                services.connection_store,
            )

        self._make_inspector = make_inspector
        self.bindings = [
            bind(
                SpecServicer(SpecService(services.store), self.blocking),
                spec_service_pb2_grpc.add_SpecServiceServicer_to_server,
                spec_service_pb2.DESCRIPTOR.services_by_name["SpecService"],
            ),
            bind(
                RunServicer(runs=services.runs, blocking=self.blocking, max_message_bytes=limit),
                run_service_pb2_grpc.add_RunServiceServicer_to_server,
                run_service_pb2.DESCRIPTOR.services_by_name["RunService"],
            ),
            bind(
                ConnectionServicer(services.connections, limit),
                connection_service_pb2_grpc.add_ConnectionServiceServicer_to_server,
                connection_service_pb2.DESCRIPTOR.services_by_name["ConnectionService"],
            ),
            bind(
                TurnServicer(
                    resolver=services.resolver,
                    assembler=services.assembler,
                    blocking=self.blocking,
                    max_message_bytes=limit,
                ),
                turn_service_pb2_grpc.add_TurnServiceServicer_to_server,
                turn_service_pb2.DESCRIPTOR.services_by_name["TurnService"],
            ),
            bind(
                ToolServicer(
                    resolver=services.resolver,
                    router=router,
                    reader=reader,
                    blocking=self.blocking,
                    max_message_bytes=limit,
                    inline_result_bytes=settings.prompt.inline_result_bytes,
                    grep_threads=settings.storage.worker_threads // 2,
                    cpu=cpu,
                ),
                tool_service_pb2_grpc.add_ToolServiceServicer_to_server,
                tool_service_pb2.DESCRIPTOR.services_by_name["ToolService"],
            ),
            bind(
                UsageServicer(UsageService(services.runs, usage), self.blocking),
                usage_service_pb2_grpc.add_UsageServiceServicer_to_server,
                usage_service_pb2.DESCRIPTOR.services_by_name["UsageService"],
            ),
        ]

    @cached_property
    def inspector(self) -> RunInspector:
        return self._make_inspector()

    def _warm_search(self, tools: Sequence[CatalogTool]) -> None:
        if self.embeddings is not None:
            self.embeddings.warm_in_background([(t.name, t.description) for t in tools])

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        self.cpu_executor.shutdown(wait=True)
        if self.no_wait is not None:
            self.no_wait.close()
        self.engine.dispose()


async def _inline(function: Callable[..., T], *args: Any) -> T:
    """RunBlocking for a one-shot reader: the call, on this thread."""
    return function(*args)


@dataclass(frozen=True, slots=True)
class DatabaseReader:
    """The domain services over a database opened read-only: never a write, never a
    migration, a known schema revision only. No MCP session runs: connection states are the
    stored ones, a prompt's server states those pinned with the turn's surface."""

    engine: Engine
    services: DomainServices

    def close(self) -> None:
        self.engine.dispose()


def open_database_reader(database_url: str, timeout: float) -> DatabaseReader:
    """Raises DatabaseRefused (no such SQLite file, an unknown schema revision)."""
    engine = open_read_only(database_url, timeout)
    # No keys: a reader shows no secret, so it never opens one (nor needs the keys).
    connection_store = SqlConnectionStore(engine, keys=None)
    from psych_sidecar.domain.inspect import StoredCatalog

    catalog = StoredCatalog(connection_store)
    # No journal: a preview writes no row anyway, and this reader writes nothing.
    services = _domain_services(
        engine,
        catalog,
        catalog,
        _inline,
        connection_store,
        live=False,
        # A reader has no settings: the caches' defaults.
        search_index_cache_bytes=SearchSettings().search_index_cache_bytes,
        resolution_cache_bytes=PromptSettings().resolution_cache_bytes,
    )
    return DatabaseReader(engine, services)

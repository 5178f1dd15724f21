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
from psych_sidecar.api.plumbing import Blocking
from psych_sidecar.api.rpc import bind
from psych_sidecar.api.runs import RunServicer
from psych_sidecar.api.specs import SpecServicer
from psych_sidecar.api.tools import ToolServicer
from psych_sidecar.api.turns import TurnServicer
from psych_sidecar.api.usage import UsageServicer
from psych_sidecar.app.secret_keys import load_secret_keys
from psych_sidecar.config import McpSettings, PromptSettings, SearchSettings, Settings
from psych_sidecar.domain.calls import (
    TaskQuestions,
    TaskTimings,
    ToolOutputReader,
    ToolRouter,
    ToolTasks,
)
from psych_sidecar.domain.catalog import (
    CatalogTool,
    CatalogView,
    ConnectionService,
    ConnectionSupervisor,
    InputWaits,
    McpToolResult,
)
from psych_sidecar.domain.prompt import PromptAssembler
from psych_sidecar.domain.runlog import RunDeletion, RunService, SpecLookup, SpecService
from psych_sidecar.domain.surface import TurnResolver
from psych_sidecar.domain.usage import UsageService
from psych_sidecar.mcp.catalog_view import SessionCatalogView
from psych_sidecar.mcp.registry import SessionRegistry
from psych_sidecar.mcp.sign_in import OAuthSignIn
from psych_sidecar.mcp.supervisor import SessionSupervisor
from psych_sidecar.mcp.task_runner import SessionTaskRunner
from psych_sidecar.mcp.tool_runner import SessionToolRunner
from psych_sidecar.search import ToolEmbeddings
from psych_sidecar.search.model import tool_embeddings
from psych_sidecar.storage.connections import SqlConnectionStore
from psych_sidecar.storage.deletion import RunDeletions
from psych_sidecar.storage.engines import create_database_engine
from psych_sidecar.storage.input_rounds import SqlInputRounds
from psych_sidecar.storage.journal import SqlAssemblyJournal
from psych_sidecar.storage.log_reads import SqlLogReader
from psych_sidecar.storage.loop_connection import LoopConnection
from psych_sidecar.storage.migrate import migrate
from psych_sidecar.storage.now import SqliteNow
from psych_sidecar.storage.oauth import SqlOAuthStore
from psych_sidecar.storage.read_only import open_read_only
from psych_sidecar.storage.repository import SqlStore, StoredSurfacePins
from psych_sidecar.storage.search_vectors import SqlVectorStore
from psych_sidecar.storage.tool_tasks import SqlToolTasks
from psych_sidecar.storage.usage import SqlUsageStore

if TYPE_CHECKING:
    import mcp_types

    from psych_sidecar.domain.prompt import AssemblyJournal, TurnSurfaces
    from psych_sidecar.domain.run_inspector import RunInspector
    from psych_sidecar.domain.runlog import OffLoop, StorageNow
    from psych_sidecar.domain.surface import SurfacePins


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
    now: StorageNow | None


def _domain_services(
    store: SqlStore,
    log: SqlLogReader,
    *,
    catalog: CatalogView,
    supervisor: ConnectionSupervisor,
    blocking: OffLoop,
    connection_store: SqlConnectionStore,
    pins: SurfacePins,
    surfaces_of: Callable[[TurnResolver], TurnSurfaces],
    search_index_cache_bytes: int,
    resolution_cache_bytes: int,
    journal: AssemblyJournal | None = None,
    embeddings: ToolEmbeddings | None = None,
    now: StorageNow | None = None,
    waits: InputWaits | None = None,
) -> DomainServices:
    """The use cases over the database of `store` and `log`: turns pinned by `pins`, prompts
    told their surfaces and servers' states by `surfaces_of(resolver)`, and `now` (SQLite)
    answering on the event loop what it can without waiting."""
    runs = RunService(store, runs=store, log=log)
    specs = SpecLookup(store)
    resolver = TurnResolver(
        runs=runs,
        specs=specs,
        catalog=catalog,
        log=log,
        embeddings=embeddings,
        search_index_cache_bytes=search_index_cache_bytes,
        resolution_cache_bytes=resolution_cache_bytes,
        pins=pins,
        now=now,
    )
    assembler = PromptAssembler(
        runs=runs,
        specs=specs,
        log=log,
        surfaces=surfaces_of(resolver),
        journal=journal,
        waits=waits,
    )
    return DomainServices(
        store=store,
        log=log,
        connection_store=connection_store,
        runs=runs,
        specs=specs,
        resolver=resolver,
        assembler=assembler,
        connections=ConnectionService(supervisor, connection_store, blocking),
        now=now,
    )


class SidecarGraph:
    """Everything a serving sidecar runs on, built from its settings; `close` releases the
    thread pools and the database once nothing uses them."""

    def __init__(
        self,
        settings: Settings,
        convert_tool_result: Callable[[mcp_types.CallToolResult], McpToolResult] | None = None,
    ) -> None:
        """`convert_tool_result` replaces how a tool result becomes what the log keeps (tests
        pass one that fails, standing in for a bug)."""
        self.settings = settings
        self.engine = create_database_engine(
            settings.resolved_database_url(),
            pool_size=settings.storage.worker_threads,
            busy_timeout_seconds=settings.storage.database_busy_timeout_seconds,
            pooling=settings.storage.database_pooling,
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
        # SQLite: a tool call's reads and a small result's append, and ResolveTurn's turn
        # start, are asked on the event loop's thread, over a connection that never waits,
        # before a worker is asked.
        self.loop_connection = (
            LoopConnection(self.engine, background=self.executor.submit)
            if self.engine.dialect.name == "sqlite"
            else None
        )
        # Sentence vectors for tool search (None: keywords only), shared by every Run, and
        # through the database by every sidecar on it.
        self.embeddings = tool_embeddings(
            settings.search.semantic_search,
            SqlVectorStore(self.engine),
            settings.search.search_model_cache_dir,
            encode_threads=settings.process.cpu_threads,
        )
        # The MCP layer: one session per connection, in one registry, over which the
        # CatalogView, the ConnectionSupervisor (with sign-in) and the ToolRunner of
        # domain/catalog are built. Each listing it stores is encoded for search in the
        # background, so the first search does not pay for it.
        self.secret_keys = load_secret_keys(settings)
        self.connection_store = connection_store = SqlConnectionStore(self.engine, self.secret_keys)
        self.mcp = SessionRegistry(
            store=connection_store,
            blocking=self.blocking,
            settings=settings.mcp,
            on_listed=self._warm_search if self.embeddings is not None else None,
            oauth=(settings.oauth, SqlOAuthStore(self.engine, self.secret_keys)),
            convert_result=convert_tool_result,
        )
        self.catalog = SessionCatalogView(self.mcp)
        self.tool_runner = SessionToolRunner(self.mcp)
        self.supervisor = SessionSupervisor(self.mcp, OAuthSignIn(self.mcp))
        # One row of metadata per AssemblePrompt, for the Run inspector (None: turned off).
        self.journal = (
            SqlAssemblyJournal(
                engine=self.engine,
                retention_seconds=settings.prompt.assembly_journal_retention_hours * 3600,
            )
            if settings.prompt.assembly_journal
            else None
        )
        # Sessions run, and each turn's surface is pinned as it is first resolved.
        store, log = SqlStore(self.engine), SqlLogReader(self.engine)
        self.input_rounds = SqlInputRounds(self.engine)
        services = _domain_services(
            store,
            log,
            catalog=self.catalog,
            supervisor=self.supervisor,
            blocking=self.blocking,
            connection_store=connection_store,
            pins=store,
            surfaces_of=lambda resolver: resolver,
            waits=self.input_rounds,
            search_index_cache_bytes=settings.search.search_index_cache_bytes,
            resolution_cache_bytes=settings.prompt.resolution_cache_bytes,
            journal=self.journal,
            embeddings=self.embeddings,
            now=None
            if self.loop_connection is None
            else SqliteNow(
                self.loop_connection, store=store, log=log, connections=connection_store
            ),
        )
        self.resolver = services.resolver
        limit = settings.listeners.max_message_bytes
        self.reader = reader = ToolOutputReader(
            services.runs,
            services.log,
            parsed_cache_bytes=settings.prompt.parsed_result_cache_bytes,
        )
        self.deletion = RunDeletion(services.runs, RunDeletions(self.engine))
        # Long calls as tasks on their servers: stored, polled by every sidecar on the
        # database (`Sidecar.start` runs the polling), ended in the log.
        self.tasks = ToolTasks(
            repository=SqlToolTasks(self.engine),
            runner=SessionTaskRunner(self.mcp),
            runs=services.runs,
            log_reader=services.log,
            blocking=self.blocking,
            timings=task_timings(settings.mcp),
            # A task's own questions wait for the host as any call's do.
            questions=TaskQuestions(
                waits=self.input_rounds,
                wait_seconds=settings.mcp.input_wait_seconds,
                blocking=self.blocking,
            ),
        )
        router = ToolRouter(
            resolver=services.resolver,
            runs=services.runs,
            log=services.log,
            runner=self.tool_runner,
            reader=reader,
            blocking=self.blocking,
            default_timeout_seconds=settings.mcp.tool_call_timeout_seconds,
            cpu=cpu,
            now=services.now,
            max_argument_bytes=limit,
            tasks=self.tasks,
            # Calls whose server asked for input wait here for ContinueToolCall.
            waits=self.input_rounds,
            input_wait_seconds=settings.mcp.input_wait_seconds,
        )
        usage = SqlUsageStore(self.engine)

        # The Run inspector's use cases, for the admin listener's /ui only: built (and the
        # domain's inspect modules imported) when first asked for.
        def make_inspector() -> RunInspector:
            from psych_sidecar.domain.run_inspector import RunInspector

            return RunInspector(
                runs=services.runs,
                log=services.log,
                journal=self.journal,
                usage=usage,
                reader=reader,
                catalog=self.catalog,
                connections=services.connection_store,
            )

        self._make_inspector = make_inspector
        self.bindings = [
            bind(
                SpecServicer(SpecService(services.store), self.blocking),
                spec_service_pb2_grpc.add_SpecServiceServicer_to_server,
                spec_service_pb2.DESCRIPTOR.services_by_name["SpecService"],
            ),
            bind(
                RunServicer(
                    runs=services.runs,
                    deletion=self.deletion,
                    blocking=self.blocking,
                    max_message_bytes=limit,
                ),
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
                    tasks=self.tasks,
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

    def migrate(self) -> None:
        """Bring the schema to this version's: on the serving engine, or on an engine of its
        own when migrations have a URL of their own (the server's, past PgBouncer)."""
        settings = self.settings
        if not settings.storage.migration_database_url:
            migrate(self.engine, self.secret_keys)
            return
        engine = create_database_engine(
            settings.storage.migration_database_url,
            pool_size=1,
            busy_timeout_seconds=settings.storage.database_busy_timeout_seconds,
        )
        try:
            migrate(engine, self.secret_keys)
        finally:
            engine.dispose()

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        self.cpu_executor.shutdown(wait=True)
        if self.loop_connection is not None:
            self.loop_connection.close()
        self.engine.dispose()


async def _inline(function: Callable[..., T], *args: Any) -> T:
    """OffLoop for a one-shot reader: the call, on this thread."""
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


def task_timings(mcp: McpSettings) -> TaskTimings:
    """How the sidecar polls tool tasks, from its settings."""
    return TaskTimings(
        first_poll=mcp.task_poll_min_seconds,
        max_poll=max(mcp.task_poll_min_seconds, mcp.task_poll_max_seconds),
        # A task's first poll is no later than a look after it falls due.
        tick=min(mcp.task_look_seconds, mcp.task_poll_min_seconds),
        # One poll or cancel is a request like a tool call; a claim outlasts it.
        request_timeout=min(30.0, mcp.tool_call_timeout_seconds),
        lease=min(30.0, mcp.tool_call_timeout_seconds) + 5,
    )


def open_database_reader(database_url: str, timeout: float) -> DatabaseReader:
    """Raises DatabaseRefused (no such SQLite file, an unknown schema revision)."""
    engine = open_read_only(database_url, timeout)
    # No keys: a reader shows no secret, so it never opens one (nor needs the keys).
    connection_store = SqlConnectionStore(engine, keys=None)
    from psych_sidecar.domain.run_inspector import PinnedStates, StoredCatalog

    catalog = StoredCatalog(connection_store)
    # No journal: a preview writes no row anyway, and this reader writes nothing.
    # No session runs: a turn's surface and its servers' states are the stored pin's.
    services = _domain_services(
        SqlStore(engine),
        SqlLogReader(engine),
        catalog=catalog,
        supervisor=catalog,
        blocking=_inline,
        connection_store=connection_store,
        pins=StoredSurfacePins(engine),
        surfaces_of=PinnedStates,
        # A preview tells the model of the calls waiting for input, as a prompt would.
        waits=SqlInputRounds(engine),
        # A reader has no settings: the caches' defaults.
        search_index_cache_bytes=SearchSettings().search_index_cache_bytes,
        resolution_cache_bytes=PromptSettings().resolution_cache_bytes,
    )
    return DatabaseReader(engine, services)

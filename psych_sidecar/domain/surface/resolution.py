"""Resolving a Run's tools from the current state: the surface of a turn, and the reads behind
the meta tools and search (list a server's permitted names, describe one, search them).

Every resolution starts from one read of the tenant's connections (their config, state and
newest catalogue version) from the database; everything derived from it is cached under a
key made of exactly that read plus the Spec and the Run's restrictions. A refresh, a config
change or a state change in any sidecar sharing the database changes the key, so a cached
surface is never stale, and nothing in one process's memory decides what another serves.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

from psych_sidecar.domain.cache import ByteBudgetCache, ImmutableCache
from psych_sidecar.domain.catalog import (
    CatalogTool,
    CatalogView,
    ConnectionState,
    connection_not_found,
)
from psych_sidecar.domain.errors import field_invalid, field_required
from psych_sidecar.domain.runlog import (
    LogReader,
    RunService,
    SpecLookup,
    StorageNow,
    decode_token,
    encode_token,
    page_size,
)
from psych_sidecar.domain.surface.ports import SurfacePins
from psych_sidecar.domain.surface.resolved import (
    CatalogSnapshot,
    IndexedTools,
    ResolvedTurn,
    RunContext,
    SearchResult,
    TenantServer,
    snapshot_key,
    turn_key,
)
from psych_sidecar.domain.surface.sidecar_tools import sidecar_tools
from psych_sidecar.domain.surface.tiers import (
    DisclosureLimits,
    ToolSurface,
    VisibleServer,
    resolve_surface,
)
from psych_sidecar.search.ranking import Embeddings

SEARCH_PAGE_SIZE = 10
MAX_SEARCH_PAGE_SIZE = 100


def _tool_bytes(tool: CatalogTool) -> int:
    """About what one catalogued tool keeps in memory (its texts, schemas, the objects)."""
    return (
        200
        + len(tool.name)
        + len(tool.description)
        + len(tool.input_schema_json)
        + len(tool.output_schema_json)
        + len(tool.annotations_json)
    )


def _tools_bytes(tools: tuple[CatalogTool, ...]) -> int:
    return 100 + sum(_tool_bytes(tool) for tool in tools)


def _snapshot_bytes(snapshot: CatalogSnapshot) -> int:
    # The tools are shared with the tools cache; the snapshot holds references to them.
    return 500 + sum(300 + 8 * len(server.tools) for server in snapshot.servers.values())


def _turn_bytes(resolved: ResolvedTurn) -> int:
    """The surface (its exposed tools carry canonical schemas) and the permitted maps; the
    tools themselves belong to the snapshot, the index to the index cache."""
    surface = sum(
        200 + len(tool.name) + len(tool.description) + len(tool.input_schema_json)
        for tool in resolved.surface.tools
    )
    permitted = sum(200 + 100 * len(tools) for tools in resolved.permitted.values())
    return 1000 + surface + permitted


class TurnResolver:
    """Resolves Runs' tool surfaces and answers the permitted-catalogue reads. Synchronous
    (it reads the database): the API layer calls it off the event loop."""

    def __init__(
        self,
        *,
        runs: RunService,
        specs: SpecLookup,
        catalog: CatalogView,
        log: LogReader,
        cache_size: int = 1024,
        embeddings: Embeddings | None = None,
        search_index_cache_bytes: int,
        resolution_cache_bytes: int,
        pins: SurfacePins | None = None,
        now: StorageNow | None = None,
    ) -> None:
        self._runs = runs
        self._log = log
        # The storage's answers on the event loop (SQLite), for `pinned_now` and
        # `resolved_now`; None: every read goes to the storage threads.
        self._now = now
        self._pin_store = pins
        self._embeddings = embeddings
        self._specs = specs
        self._catalog = catalog
        # Keyed by content read from the database: an entry never goes stale, it just stops
        # being asked for.
        # Bounded by bytes, not counts: one catalogue of 10,000 tools weighs as much as
        # thousands of small ones. Half the budget for catalogues, half for resolved turns.
        self._tools_cache = ByteBudgetCache[tuple[str, str, int], tuple[CatalogTool, ...]](
            resolution_cache_bytes // 2, _tools_bytes
        )
        self._snapshot_cache = ByteBudgetCache[Hashable, CatalogSnapshot](
            resolution_cache_bytes // 8, _snapshot_bytes
        )
        self._turn_cache = ByteBudgetCache[Hashable, ResolvedTurn](
            resolution_cache_bytes * 3 // 8, _turn_bytes
        )
        # Search indexes, shared per catalogue versions and reach. An index of catalogue
        # versions no longer current is no longer asked for and is the first to go.
        self._index_cache = ByteBudgetCache[Hashable, IndexedTools](
            search_index_cache_bytes, lambda indexed: indexed[0].approximate_bytes
        )
        self._index_builds: dict[Hashable, threading.Lock] = {}
        self._index_builds_lock = threading.Lock()
        # The surface each (Run, turn) was first resolved with: what the model sees for the
        # whole turn. A turn's records never change, so its pin never goes stale.
        self._pins = ImmutableCache[tuple[str, int], ToolSurface](cache_size * 16)
        self._pin_lock = threading.Lock()

    def context(self, run_id: str) -> RunContext:
        run = self._runs.get(run_id)
        return RunContext(run, self._specs.get(run.spec_name, run.spec_version))

    def snapshot(self, tenant: str) -> CatalogSnapshot:
        """The tenant's connections as the database has them now; tools from cache when their
        catalogue version was seen before."""
        connections = self._catalog.tenant_connections(tenant)
        key = snapshot_key(tenant, connections)
        cached = self._snapshot_cache.get(key)
        if cached is not None:
            return cached
        servers = {}
        for connection, status in connections:
            tools_key = (tenant, connection.name, status.catalog_version)
            tools = self._tools_cache.get(tools_key)
            if tools is None:
                # The tools of the very version read above, so the cache key is honest.
                tools = tuple(
                    self._catalog.current_tools(tenant, connection.name, status.catalog_version)
                )
                self._tools_cache.put(tools_key, tools)
            servers[connection.name] = TenantServer(connection, status, tools)
        snapshot = CatalogSnapshot(tenant, key, servers)
        self._snapshot_cache.put(key, snapshot)
        return snapshot

    def resolve(self, context: RunContext) -> ResolvedTurn:
        """The Run's tools as of now."""
        snapshot = self.snapshot(context.run.tenant)
        spec = context.spec
        key = turn_key(snapshot.key, context)
        cached = self._turn_cache.get(key)
        if cached is not None:
            return cached
        grants = context.grants
        visible = []
        permitted: dict[str, dict[str, CatalogTool]] = {}
        for name, server in snapshot.servers.items():
            # A connection no grant names is not the Run's to see; one that is granted stays
            # visible even with no tools (never listed yet, or unreachable from the start).
            if not grants.may_reach_server(name):
                continue
            allowed = tuple(grants.permitted(server.connection, server.tools))
            visible.append(VisibleServer(server.connection, server.status, allowed))
            permitted[name] = {tool.name: tool for tool in allowed}
        mcp_surface = resolve_surface(visible, DisclosureLimits.of(spec.disclosure))
        # The sidecar's own tools are on every surface; their names are reserved, so they
        # never collide with an MCP tool's.
        tools = sorted((*mcp_surface.tools, *sidecar_tools(spec)), key=lambda tool: tool.name)
        surface = ToolSurface(tuple(tools), mcp_surface.servers)
        resolved = ResolvedTurn(
            surface, permitted, snapshot, self._embeddings, index_source=self._search_index
        )
        self._turn_cache.put(key, resolved)
        return resolved

    def _search_index(self, resolved: ResolvedTurn) -> IndexedTools:
        """The shared index for this reach, built once even when many searches ask at once,
        and refreshed with the tool vectors that became known since."""
        key = resolved.index_key
        cached = self._index_cache.get(key)
        if cached is None:
            with self._index_builds_lock:
                building = self._index_builds.setdefault(key, threading.Lock())
            try:
                with building:
                    cached = self._index_cache.get(key)
                    if cached is None:
                        cached = resolved.build_index()
                        self._index_cache.put(key, cached)
            finally:
                with self._index_builds_lock:
                    if self._index_builds.get(key) is building and not building.locked():
                        del self._index_builds[key]
        refreshed = cached[0].refreshed()
        if refreshed is not cached[0]:
            cached = (refreshed, cached[1])
            self._index_cache.put(key, cached)
        return cached

    @property
    def search_indexes(self) -> tuple[int, int]:
        """How many search indexes are cached and what they weigh (an estimate)."""
        return len(self._index_cache), self._index_cache.bytes

    def server_states(self, run_id: str) -> dict[str, ConnectionState]:
        """The state of each of the Run's tenant's connections, as the database has it now
        (for the transient message: a state is said where it may change every call)."""
        run = self._runs.get(run_id)
        return {c.name: s.state for c, s in self._catalog.tenant_connections(run.tenant)}

    def resolve_turn(self, run_id: str) -> ToolSurface:
        """The Run's tool surface for its current turn, pinned: resolved at the turn's first
        ResolveTurn or AssemblePrompt (a turn starts at a user message) and the same object
        for every later step of it, so the tools and the roster do not change mid-turn. A
        server connected, removed or re-tiered, or a grant changed, shows at the next turn;
        calls are re-checked against the current state anyway (`resolved`)."""
        context = self.context(run_id)
        key = (run_id, self._log.turn_start(run_id))
        pinned = self._pins.get(key)
        if pinned is not None:
            return pinned
        surface = self.resolve(context).surface
        if self._pin_store is not None:
            # Shared by every sidecar on the database: the first pin of the turn wins.
            mine = surface.to_json()
            stored = self._pin_store.pin_surface(*key, mine)
            if stored != mine:
                surface = ToolSurface.from_json(stored)
        with self._pin_lock:
            # Two first steps racing in this process: the first pin wins, both answer with it.
            pinned = self._pins.get(key)
            if pinned is None:
                self._pins.put(key, surface)
                pinned = surface
        return pinned

    def pinned_now(self, run_id: str) -> ToolSurface | None:
        """What `resolve_turn` answers, when it is at hand without waiting: the turn start
        from the non-waiting reader, the surface pinned to that turn from memory. None
        otherwise (no such reader, it would wait, or the turn is not pinned here yet): call
        `resolve_turn`. Every step of a turn after its first is answered here, without a
        worker thread. The pins in memory are keyed by the turns they pinned, so a Run that
        is unknown or was never resolved here just misses."""
        if self._now is None:
            return None
        start = self._now.turn_start(run_id)
        return None if start is None else self._pins.get((run_id, start))

    def resolved(self, run_id: str) -> tuple[RunContext, ResolvedTurn]:
        context = self.context(run_id)
        return context, self.resolve(context)

    def resolved_now(self, run_id: str) -> tuple[RunContext, ResolvedTurn] | None:
        """What `resolved` answers, when it is at hand without waiting: the Run and its Spec
        from memory, the tenant's connection versions from the storage's answer now, the
        connections, the snapshot and the resolved turn from the caches. None otherwise (no
        `now`, the storage would wait, anything not cached: a surface to build or a catalogue
        to read does work that grows with a catalogue): call `resolved` on a storage thread.
        Every call of a Run after its first, while the catalogue stays as it was, is
        answered here."""
        if self._now is None:
            return None
        run = self._runs.cached(run_id)
        if run is None:
            return None
        spec = self._specs.cached(run.spec_name, run.spec_version)
        if spec is None:
            return None
        versions = self._now.connection_versions(run.tenant)
        if versions is None:
            return None
        connections = self._catalog.tenant_connections_now(run.tenant, versions)
        if connections is None:
            return None
        snapshot = self._snapshot_cache.get(snapshot_key(run.tenant, connections))
        if snapshot is None:
            return None
        context = RunContext(run, spec)
        resolved = self._turn_cache.get(turn_key(snapshot.key, context))
        return None if resolved is None else (context, resolved)

    # Reads for hosts (typed RPCs); the model-facing versions are tool results instead.

    def list_server_tools(
        self, run_id: str, server: str, requested_page_size: int, page_token: str
    ) -> tuple[list[str], str]:
        if not server:
            raise field_required("server")
        limit = page_size(requested_page_size)
        scope = f"tools|{run_id}|{server}"
        after = decode_token(page_token, scope)
        _, resolved = self.resolved(run_id)
        names = sorted(self._permitted_on(resolved, server))
        if isinstance(after, str):
            names = [name for name in names if name > after]
        page = names[:limit]
        return page, encode_token(scope, page[-1]) if len(names) > limit else ""

    def describe_tool(self, run_id: str, server: str, tool: str) -> CatalogTool:
        if not server:
            raise field_required("server")
        if not tool:
            raise field_required("tool")
        _, resolved = self.resolved(run_id)
        found = self._permitted_on(resolved, server).get(tool)
        if found is None:
            raise field_invalid("tool", f"the run may use no tool {tool!r} on server {server!r}")
        return found

    def search_tools(
        self, run_id: str, query: str, requested_page_size: int, page_token: str
    ) -> tuple[list[SearchResult], str, bool]:
        """A page of hits, the next page's token, and whether the ranking was partial."""
        if not query.strip():
            raise field_required("query")
        limit = page_size(requested_page_size, SEARCH_PAGE_SIZE, MAX_SEARCH_PAGE_SIZE)
        scope = f"search|{run_id}|{query}"
        start = decode_token(page_token, scope) or 0
        if not isinstance(start, int):
            raise field_invalid("page_token", "not a token of this search")
        _, resolved = self.resolved(run_id)
        hits, ranking = resolved.ranked_search(query, start + limit + 1)
        page = hits[start : start + limit]
        token = encode_token(scope, start + limit) if len(hits) > start + limit else ""
        return page, token, ranking.partial

    @staticmethod
    def _permitted_on(resolved: ResolvedTurn, server: str) -> dict[str, CatalogTool]:
        """The Run's permitted tools on a server it can see; CONNECTION_NOT_FOUND for one it
        cannot (another tenant's, or one no grant names: the same answer, revealing nothing)."""
        tools = resolved.permitted.get(server)
        if tools is None:
            raise connection_not_found(resolved.snapshot.tenant, server)
        return tools

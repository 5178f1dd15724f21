"""What a resolution is made of: a tenant's catalogue snapshot, a resolved turn (what a Run may
reach, with its search), a Run with its Spec, and the cache keys they are found under
(`TurnResolver` builds and caches them)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from psych_sidecar.domain.catalog import CatalogTool, Connection, ConnectionStatus, Grants
from psych_sidecar.domain.runlog import Run, Spec
from psych_sidecar.domain.surface import naming
from psych_sidecar.domain.surface.tiers import ExposedTool, ToolSurface
from psych_sidecar.search.ranking import (
    Embeddings,
    Ranking,
    SearchDocument,
    SearchIndex,
    listing_texts,
)

# A search index with the (server, tool) of each of its documents.
IndexedTools = tuple[SearchIndex, list[tuple[str, CatalogTool]]]


def snapshot_key(tenant: str, connections: list[tuple[Connection, ConnectionStatus]]) -> Hashable:
    """A catalogue snapshot's cache key: the tenant and everything about its connections."""
    return (tenant, tuple(connection_key(c, s) for c, s in connections))


def turn_key(snapshot_key: Hashable, context: RunContext) -> Hashable:
    """A resolved turn's cache key: the snapshot's, the Spec version and the Run's
    restrictions."""
    spec = context.spec
    return (snapshot_key, spec.name, spec.version, context.run.tool_restrictions)


def connection_key(connection: Connection, status: ConnectionStatus) -> Hashable:
    """Everything about a connection that changes what a Run sees of it."""
    return (
        connection.name,
        connection.preload,
        connection.eager_tools,
        connection.description,
        connection.allow_tools,
        connection.deny_tools,
        status.state.value,
        status.catalog_version,
    )


@dataclass(frozen=True, slots=True)
class TenantServer:
    """A connection with every tool of its current (or last known) catalogue, not narrowed."""

    connection: Connection
    status: ConnectionStatus
    tools: tuple[CatalogTool, ...]


@dataclass(frozen=True, slots=True)
class CatalogSnapshot:
    """A tenant's connections and their tools, as read now."""

    tenant: str
    key: Hashable
    servers: dict[str, TenantServer]  # by connection name


@dataclass(frozen=True, slots=True)
class SearchResult:
    server: str
    tool: CatalogTool
    score: float


@dataclass
class ResolvedTurn:
    """What a Run may reach, as of one snapshot. Immutable once built (the search index is
    built on first use, under a lock)."""

    surface: ToolSurface
    permitted: dict[str, dict[str, CatalogTool]]  # server -> tool name -> tool, sorted
    snapshot: CatalogSnapshot
    embeddings: Embeddings | None = None
    # Where the search index comes from: the resolver's byte-bounded cache, shared by every
    # Run and turn that may reach the same tools of the same catalogue versions.
    index_source: Callable[[ResolvedTurn], IndexedTools] | None = None
    _index: SearchIndex | None = None
    _entries: list[tuple[str, CatalogTool]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    routes: dict[str, ExposedTool] = field(init=False)

    def __post_init__(self) -> None:
        self.routes = {tool.name: tool for tool in self.surface.tools}

    @property
    def index_key(self) -> Hashable:
        """What the search index depends on: the catalogue versions read and the tools this
        turn may reach (Runs of different Specs with the same reach share one index)."""
        return (
            self.snapshot.key,
            tuple((server, tuple(tools)) for server, tools in self.permitted.items()),
        )

    def build_index(self) -> IndexedTools:
        """A new search index over the permitted tools (the expensive step: tokenizing and,
        with embeddings, encoding every text not encoded before)."""
        documents, entries = [], []
        for server, tools in self.permitted.items():
            listing = self.snapshot.servers[server]
            # The encoder's texts come from the whole listing, as the warm-up encoded them,
            # not from the tools this turn may reach.
            encoder_texts = (
                dict(
                    zip(
                        (tool.name for tool in listing.tools),
                        listing_texts([(tool.name, tool.description) for tool in listing.tools]),
                        strict=True,
                    )
                )
                if self.embeddings is not None and self.embeddings.available()
                else {}
            )
            for tool in tools.values():
                entries.append((server, tool))
                documents.append(
                    SearchDocument(
                        server,
                        tool.name,
                        tool.description,
                        _parameter_names(tool.input_schema_json),
                        listing.connection.description,
                        encoder_texts.get(tool.name),
                    )
                )
        return SearchIndex(documents, self.embeddings), entries

    def ranked_search(self, query: str, limit: int) -> tuple[list[SearchResult], Ranking]:
        """The hits, and the ranking they come from, which says whether it was partial (some
        tools' vectors, or the model for the query, not ready yet: those were ranked by
        keywords) and for how many tools. Never encodes a tool."""
        if self.index_source is not None:
            index, entries = self.index_source(self)
        else:
            with self._lock:
                if self._index is not None:
                    self._index = self._index.refreshed()
                else:
                    self._index, self._entries = self.build_index()
                index, entries = self._index, self._entries
        ranking = index.rank(query, limit)
        results = [
            SearchResult(entries[hit.index][0], entries[hit.index][1], hit.score)
            for hit in ranking.hits
        ]
        return results, ranking


def _parameter_names(schema_json: bytes) -> tuple[str, ...]:
    try:
        schema = json.loads(schema_json) if schema_json else {}
    except ValueError:
        return ()
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return tuple(sorted(properties)) if isinstance(properties, dict) else ()


@dataclass(frozen=True, slots=True)
class RunContext:
    run: Run
    spec: Spec

    @property
    def grants(self) -> Grants:
        return Grants(self.spec.grants, self.run.tool_restrictions)


def qualified_names(resolved: ResolvedTurn) -> dict[str, tuple[str, str]]:
    """Search results name a tool as its direct-tool name; this maps those back."""
    return {
        naming.tool_name(server, name): (server, name)
        for server, tools in resolved.permitted.items()
        for name in tools
    }

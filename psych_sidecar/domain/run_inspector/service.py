"""RunInspector: the read-only views of the Run inspector, from domain services and ports.

Everything here reads; nothing writes. Sizes come from the assembly journal (estimated
tokens: a budget view) and usage from RecordUsage (provider-reported numbers), shown side by
side and never mixed: the inspector adds no number of one kind to a number of the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from psych_sidecar.domain.calls import ReadResult, ToolOutputReader
from psych_sidecar.domain.catalog import (
    CatalogDiff,
    CatalogTool,
    CatalogView,
    Connection,
    ConnectionRepository,
    ConnectionStatus,
    diff_catalog,
)
from psych_sidecar.domain.prompt import AssemblyEntry, AssemblyJournal, ElidedResult
from psych_sidecar.domain.run_inspector.explain import CacheMiss, explain_miss
from psych_sidecar.domain.runlog import (
    AllTenants,
    ListedRun,
    LogReader,
    RecordKind,
    RecordSkeleton,
    Run,
    RunService,
    split_compaction,
    validate_name,
)
from psych_sidecar.domain.usage import UsageEvent, UsageRepository

# Bounds of one page: the newest calls, runs and catalogue versions shown.
MAX_CALLS = 500
MAX_RUNS = 200
MAX_VERSIONS = 8
READ_MAX_BYTES = 64 * 1024
MAX_COMPACTIONS = 500
# Summaries read per page of compaction records (each summary is capped by its policy).
_COMPACTION_PAGE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One AssemblePrompt, with the usage recorded after it (when the host recorded one) and
    why its cached prefix missed (when it did)."""

    index: int
    entry: AssemblyEntry
    usage: UsageEvent | None
    miss: CacheMiss | None


@dataclass(frozen=True, slots=True)
class CompactionView:
    """One compaction record: the records and turns its summary stands for (turn 1 is the
    first user message's), the summary's size, and when the host appended it."""

    sequence: int
    create_time: datetime
    first_sequence: int
    last_sequence: int
    first_turn: int
    last_turn: int
    summary_chars: int
    summary_bytes: int


@dataclass(frozen=True, slots=True)
class Timeline:
    run: Run
    calls: tuple[ModelCall, ...]
    # Whether older calls fell out of the page or the journal's retention.
    truncated: bool
    journal_enabled: bool
    # The Run's compactions, oldest first (from the log: there with the journal off too).
    compactions: tuple[CompactionView, ...] = ()


def compaction_views(runs: RunService, log: LogReader, run_id: str) -> list[CompactionView]:
    """The Run's compaction records (the first `MAX_COMPACTIONS`), each read once, with the
    turns of its range found by indexed counts."""
    views: list[CompactionView] = []
    token = ""
    while len(views) < MAX_COMPACTIONS:
        stored, token = runs.list_records(
            run_id,
            (RecordKind.COMPACTION,),
            MAX_COMPACTIONS - len(views),
            token,
            _COMPACTION_PAGE_BYTES,
        )
        for record in stored:
            summary, covered = split_compaction(record.record.content)
            text = "".join(part.as_text() for part in summary)
            views.append(
                CompactionView(
                    sequence=record.sequence,
                    create_time=record.create_time,
                    first_sequence=covered.first_sequence,
                    last_sequence=covered.last_sequence,
                    # The first turn that starts in the range (a range may open on the
                    # previous compaction record, inside that compaction's last turn).
                    first_turn=log.turn_of(run_id, covered.first_sequence - 1) + 1,
                    last_turn=log.turn_of(run_id, covered.last_sequence),
                    summary_chars=len(text),
                    summary_bytes=sum(len(part.data) for part in summary),
                )
            )
        if not token:
            break
    return views


@dataclass(frozen=True, slots=True)
class ResultRow:
    record: RecordSkeleton
    turn: int
    # How the newest journalled prompt showed it: elided (and by which rule) or not.
    elided: ElidedResult | None
    current_turn: bool


@dataclass(frozen=True, slots=True)
class CatalogVersionView:
    version: int
    tool_count: int
    # Against the version before it (the first version: everything added; None when the
    # version before it is not readable).
    diff: CatalogDiff | None
    # Listed tools the version left out (invalid definitions).
    rejected_count: int = 0


@dataclass(frozen=True, slots=True)
class ConnectionView:
    connection: Connection  # secrets emptied
    status: ConnectionStatus
    versions: tuple[CatalogVersionView, ...]


def pair_usage(entries: Sequence[AssemblyEntry], events: Sequence[UsageEvent]) -> list[int | None]:
    """For each entry, the index of the usage event recorded after it and before the next
    entry (the host's loop: AssemblePrompt, call the provider, RecordUsage); None when the
    host recorded none for that call."""
    paired: list[int | None] = []
    position = 0
    for index, entry in enumerate(entries):
        following = entries[index + 1].time if index + 1 < len(entries) else None
        while position < len(events) and events[position].time < entry.time:
            position += 1
        if position < len(events) and (following is None or events[position].time < following):
            paired.append(position)
            position += 1
        else:
            paired.append(None)
    return paired


class RunInspector:
    def __init__(
        self,
        *,
        runs: RunService,
        log: LogReader,
        journal: AssemblyJournal | None,
        usage: UsageRepository,
        reader: ToolOutputReader,
        catalog: CatalogView,
        connections: ConnectionRepository,
    ) -> None:
        self._runs = runs
        self._log = log
        self._journal = journal
        self._usage = usage
        self._reader = reader
        self._catalog = catalog
        self._connections = connections

    def runs(self, tenant: str | AllTenants) -> list[ListedRun]:
        """The newest Runs (of a tenant, or of ALL_TENANTS) with their last activity."""
        listed, _ = self._runs.list_runs(tenant, MAX_RUNS, "", with_activity=True)
        return listed

    def tenants(self) -> list[str]:
        return self._runs.tenants(MAX_RUNS)

    def run(self, run_id: str) -> Run:
        return self._runs.get(run_id)

    def timeline(self, run_id: str) -> Timeline:
        run = self._runs.get(run_id)
        compactions = tuple(compaction_views(self._runs, self._log, run_id))
        if self._journal is None:
            return Timeline(run, (), False, False, compactions)
        entries = self._journal.entries(run_id, MAX_CALLS + 1)
        truncated = len(entries) > MAX_CALLS
        entries = entries[-MAX_CALLS:]
        events = self._usage.usage_events(run_id, 2 * MAX_CALLS)
        pairs = pair_usage(entries, events)
        calls = []
        previous: AssemblyEntry | None = None
        for index, (entry, event) in enumerate(zip(entries, pairs, strict=True)):
            calls.append(
                ModelCall(
                    index + 1,
                    entry,
                    None if event is None else events[event],
                    explain_miss(previous, entry),
                )
            )
            previous = entry
        return Timeline(run, tuple(calls), truncated, True, compactions)

    def tool_results(self, run_id: str) -> list[ResultRow]:
        self._runs.get(run_id)
        records = self._log.record_skeletons(run_id)
        latest = self._journal.entries(run_id, 1) if self._journal is not None else []
        elided = {e.sequence: e for e in latest[0].elided} if latest else {}
        turns = sum(1 for r in records if r.kind is RecordKind.USER_MESSAGE)
        rows = []
        turn = 0
        for record in records:
            if record.kind is RecordKind.USER_MESSAGE:
                turn += 1
            elif record.kind is RecordKind.TOOL_RESULT:
                rows.append(ResultRow(record, turn, elided.get(record.sequence), turn == turns))
        return rows

    def read(self, run_id: str, handle: str, offset: int, limit: int, grep: str) -> ReadResult:
        """ReadToolOutput's semantics exactly: the same reader, the same errors."""
        return self._reader.read(run_id, handle, offset, limit, grep, READ_MAX_BYTES)

    def connections(self, tenant: str) -> list[ConnectionView]:
        validate_name(tenant, "tenant")
        views = []
        for connection, live in self._catalog.tenant_connections(tenant):
            stored = self._connections.get_connection(tenant, connection.name)
            # The newest version's rejected tools, with the live state.
            status = live if stored is None else replace(live, rejected=stored.rejected)
            rejected_counts = self._rejected_counts(tenant, connection.name)
            versions: list[CatalogVersionView] = []
            newest = status.catalog_version
            oldest = max(1, newest - MAX_VERSIONS + 1)
            previous: list[CatalogTool] | None = [] if oldest == 1 else None
            if oldest > 1:
                read = self._connections.catalog_tools(tenant, connection.name, oldest - 1)
                previous = read[1] if read is not None else None
            for version in range(oldest, newest + 1):
                read = self._connections.catalog_tools(tenant, connection.name, version)
                if read is None:
                    previous = None
                    continue
                tools = read[1]
                diff = diff_catalog(previous, tools) if previous is not None else None
                versions.append(
                    CatalogVersionView(version, len(tools), diff, rejected_counts.get(version, 0))
                )
                previous = tools
            views.append(ConnectionView(connection, status, tuple(reversed(versions))))
        return views

    def _rejected_counts(self, tenant: str, name: str) -> dict[int, int]:
        read = self._connections.catalog_versions(tenant, name, 0, MAX_VERSIONS)
        listed = read[0] if read is not None else []
        return {version.catalog_version: version.rejected_count for version in listed}

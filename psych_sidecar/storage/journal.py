"""The assembly journal (`assembly_journal`): one row of metadata per AssemblePrompt, kept for
a bounded time."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from sqlalchemy import Engine, delete, insert
from sqlalchemy.engine import Row
from sqlalchemy.exc import SQLAlchemyError

from psych_sidecar.domain.prompt import (
    AssemblyEntry,
    ElidedResult,
    ElisionRule,
    SurfaceServer,
    Zone,
    ZoneSize,
)
from psych_sidecar.domain.runlog import new_id
from psych_sidecar.storage import tables
from psych_sidecar.storage.transactions import newest_of_run, write_transaction

log = logging.getLogger(__name__)

_ZONE_COLUMNS = {
    Zone.STATIC_SYSTEM: "static",
    Zone.DYNAMIC_TAIL: "tail",
    Zone.HISTORY: "history",
    Zone.TRANSIENT: "transient",
}
# Pruning is one indexed DELETE; doing it at most this often keeps it off most calls.
DEFAULT_PRUNE_INTERVAL_SECONDS = 60.0


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class SqlAssemblyJournal:
    """Implements the domain's AssemblyJournal. Entries older than `retention_seconds` are
    deleted by the writes that follow them (at most once per `prune_interval_seconds` per
    process); `clock` gives microseconds since the epoch."""

    def __init__(
        self,
        engine: Engine,
        *,
        retention_seconds: float,
        prune_interval_seconds: float = DEFAULT_PRUNE_INTERVAL_SECONDS,
        clock: Callable[[], int] = tables.now_us,
    ) -> None:
        self._engine = engine
        self._retention_us = int(retention_seconds * 1_000_000)
        self._prune_interval_us = int(prune_interval_seconds * 1_000_000)
        self._clock = clock
        self._lock = threading.Lock()
        self._next_prune_us = 0

    def record(self, entry: AssemblyEntry) -> None:
        """Best effort: the journal is diagnostics, so a database error writing it is logged
        and the prompt, already assembled, is still answered."""
        try:
            self._record(entry)
        except SQLAlchemyError as error:
            log.warning(
                "assembly journal: could not record a prompt of run %s: %s",
                entry.run_id,
                type(error).__name__,
            )

    def _record(self, entry: AssemblyEntry) -> None:
        now = self._clock()
        values: dict[str, object] = {
            "entry_id": new_id("a_"),
            "run_id": entry.run_id,
            "create_time_us": now,
            "model": entry.model,
            "spec_name": entry.spec_name,
            "spec_version": entry.spec_version,
            "turn": entry.turn,
            "step": entry.step,
            "last_sequence": entry.last_sequence,
            "tool_count": entry.tool_count,
            "servers": _compact(
                [
                    [s.server, s.state, s.tier, s.catalog_version, s.permitted_tool_count]
                    for s in entry.servers
                ]
            ),
            "elided": _compact([[e.sequence, e.handle, e.rule.value] for e in entry.elided]),
            "context_guard": entry.context_guard,
            "compacted_through": entry.compacted_through or None,
        }
        for size in entry.zones:
            prefix = _ZONE_COLUMNS[size.zone]
            values[f"{prefix}_bytes"] = size.byte_length
            values[f"{prefix}_tokens"] = size.estimated_tokens
            values[f"{prefix}_sha256"] = size.sha256
        with write_transaction(self._engine) as conn:
            conn.execute(insert(tables.assembly_journal).values(**values))
            if self._prune_due(now):
                journal = tables.assembly_journal
                conn.execute(
                    delete(journal).where(journal.c.create_time_us < now - self._retention_us)
                )

    def _prune_due(self, now: int) -> bool:
        with self._lock:
            if now < self._next_prune_us:
                return False
            self._next_prune_us = now + self._prune_interval_us
            return True

    def entries(self, run_id: str, limit: int) -> list[AssemblyEntry]:
        rows = newest_of_run(self._engine, tables.assembly_journal, "entry_id", run_id, limit)
        return [_entry(row) for row in rows]


def _entry(row: Row[object]) -> AssemblyEntry:
    m = row._mapping
    zones = tuple(
        ZoneSize(
            zone,
            int(m[f"{prefix}_bytes"]),
            int(m[f"{prefix}_tokens"]),
            str(m[f"{prefix}_sha256"]),
        )
        for zone, prefix in _ZONE_COLUMNS.items()
    )
    return AssemblyEntry(
        run_id=str(m["run_id"]),
        time=tables.from_us(int(m["create_time_us"])),
        model=str(m["model"]),
        spec_name=str(m["spec_name"]),
        spec_version=int(m["spec_version"]),
        turn=int(m["turn"]),
        step=int(m["step"]),
        last_sequence=int(m["last_sequence"]),
        zones=zones,
        tool_count=int(m["tool_count"]),
        servers=tuple(
            SurfaceServer(str(s), str(state), str(tier), int(version), int(count))
            for s, state, tier, version, count in json.loads(str(m["servers"]))
        ),
        elided=tuple(
            ElidedResult(int(sequence), str(handle), ElisionRule(rule))
            for sequence, handle, rule in json.loads(str(m["elided"]))
        ),
        context_guard=None if m["context_guard"] is None else str(m["context_guard"]),
        compacted_through=int(m["compacted_through"] or 0),
    )

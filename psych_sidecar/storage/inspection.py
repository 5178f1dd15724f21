"""Reads across Runs for the Run inspector (the domain's RunDirectory): metadata only."""

from __future__ import annotations

from sqlalchemy import Engine, select

from psych_sidecar.domain.inspect import RecordSummary, RunSummary
from psych_sidecar.domain.runlog import RecordKind
from psych_sidecar.storage import tables
from psych_sidecar.storage.db import transaction
from psych_sidecar.storage.repository import select_runs


class SqlRunDirectory:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def list_runs(self, tenant: str, limit: int) -> list[RunSummary]:
        rows, _ = select_runs(self._engine, tenant, "", limit, activity=True)
        return [
            RunSummary(
                row.run_id,
                row.tenant,
                row.spec_name,
                int(row.spec_version),
                tables.from_us(row.create_time_us),
                int(row.last_sequence),
                tables.from_us(int(row.last_activity_us)),
            )
            for row in rows
        ]

    def tenants(self, limit: int) -> list[str]:
        runs = tables.runs
        query = select(runs.c.tenant).distinct().order_by(runs.c.tenant).limit(limit)
        with transaction(self._engine, write=False) as conn:
            return [str(tenant) for (tenant,) in conn.execute(query)]

    def record_summaries(self, run_id: str) -> list[RecordSummary]:
        r = tables.records
        query = (
            select(
                r.c.sequence,
                r.c.kind,
                r.c.server,
                r.c.tool,
                r.c.call_id,
                r.c.is_error,
                r.c.content_bytes,
                r.c.handle,
                r.c.create_time_us,
            )
            .where(r.c.run_id == run_id)
            .order_by(r.c.sequence)
        )
        with transaction(self._engine, write=False) as conn:
            rows = conn.execute(query).all()
        return [
            RecordSummary(
                int(sequence),
                RecordKind(kind),
                server,
                tool,
                call_id,
                bool(is_error),
                int(content_bytes),
                handle or "",
                tables.from_us(created),
            )
            for (
                sequence,
                kind,
                server,
                tool,
                call_id,
                is_error,
                content_bytes,
                handle,
                created,
            ) in rows
        ]


class StoredSurfacePins:
    """The domain's SurfacePins for a reader that must not write: the turn's stored pin when
    a sidecar made one, else the surface just resolved, stored nowhere."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def pin_surface(self, run_id: str, turn_start: int, surface_json: bytes) -> bytes:
        pins = tables.turn_surfaces
        query = select(pins.c.surface).where(
            pins.c.run_id == run_id, pins.c.turn_start == turn_start
        )
        with transaction(self._engine, write=False) as conn:
            stored = conn.execute(query).scalar()
        return surface_json if stored is None else str(stored).encode()

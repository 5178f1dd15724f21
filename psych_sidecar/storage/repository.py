"""SqlStore: the domain's repositories over SQLAlchemy Core, for SQLite and PostgreSQL: specs,
Runs, their records' listing and the turns' surface pins; the append path is storage/appends.py."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import (
    Engine,
    Row,
    and_,
    func,
    insert,
    or_,
    select,
)
from sqlalchemy.exc import IntegrityError

from psych_sidecar.domain.runlog import (
    AllTenants,
    ListedRun,
    PublishedSpec,
    Record,
    RecordKind,
    Run,
    Spec,
    StoredRecord,
    ToolCall,
    ToolGrant,
)
from psych_sidecar.storage import tables
from psych_sidecar.storage.appends import RecordAppends, records_content
from psych_sidecar.storage.statements import insert_ignoring_conflicts
from psych_sidecar.storage.transactions import read_transaction, write_transaction


class SqlStore(RecordAppends):
    """Implements SpecRepository and RunRepository (its append path in RecordAppends,
    storage/appends.py) and SurfacePins. Every method is one transaction."""

    # Specs

    def insert_spec(self, spec: Spec) -> PublishedSpec:
        existing = self.get_spec(spec.name, spec.version)
        if existing is not None:
            return existing
        now = tables.now_us()
        try:
            with write_transaction(self._engine) as conn:
                conn.execute(
                    insert(tables.specs).values(
                        name=spec.name,
                        version=spec.version,
                        body=spec.content_json(),
                        fingerprint=spec.fingerprint(),
                        create_time_us=now,
                    )
                )
        except IntegrityError:
            # Another publisher won the race; the caller compares content.
            stored = self.get_spec(spec.name, spec.version)
            assert stored is not None
            return stored
        return PublishedSpec(spec, tables.from_us(now))

    def get_spec(self, name: str, version: int) -> PublishedSpec | None:
        with read_transaction(self._engine) as conn:
            row = conn.execute(
                select(tables.specs.c.body, tables.specs.c.create_time_us).where(
                    tables.specs.c.name == name, tables.specs.c.version == version
                )
            ).first()
        if row is None:
            return None
        return PublishedSpec(Spec.from_content_json(row.body), tables.from_us(row.create_time_us))

    # Runs

    def insert_run(
        self,
        run_id: str,
        tenant: str,
        spec_name: str,
        spec_version: int,
        tool_restrictions: tuple[ToolGrant, ...],
    ) -> Run:
        now = tables.now_us()
        restrictions = json.dumps([[g.server_pattern, g.tool_pattern] for g in tool_restrictions])
        with write_transaction(self._engine) as conn:
            conn.execute(
                insert(tables.runs).values(
                    run_id=run_id,
                    tenant=tenant,
                    spec_name=spec_name,
                    spec_version=spec_version,
                    tool_restrictions=restrictions,
                    create_time_us=now,
                    last_sequence=0,
                )
            )
        return Run(run_id, tenant, spec_name, spec_version, tool_restrictions, tables.from_us(now))

    def get_run(self, run_id: str) -> Run | None:
        runs = tables.runs
        with read_transaction(self._engine) as conn:
            row = conn.execute(select(runs).where(runs.c.run_id == run_id)).first()
        return None if row is None else _run(row)

    def list_runs(
        self, tenant: str | AllTenants, after_run_id: str, limit: int, with_activity: bool
    ) -> tuple[list[ListedRun], bool]:
        rows, more = _select_runs(self._engine, tenant, after_run_id, limit, with_activity)
        return [
            ListedRun(
                _run(row),
                int(row.last_sequence),
                tables.from_us(int(row.last_activity_us)) if with_activity else None,
            )
            for row in rows
        ], more

    def tenants(self, limit: int) -> list[str]:
        runs = tables.runs
        query = select(runs.c.tenant).distinct().order_by(runs.c.tenant).limit(limit)
        with read_transaction(self._engine) as conn:
            return [str(tenant) for (tenant,) in conn.execute(query)]

    def pin_surface(self, run_id: str, turn_start: int, surface_json: bytes) -> bytes:
        pins = tables.turn_surfaces
        with write_transaction(self._engine) as conn:
            conn.execute(
                insert_ignoring_conflicts(self._engine.dialect, pins),
                {
                    "run_id": run_id,
                    "turn_start": turn_start,
                    "surface": surface_json.decode(),
                    "create_time_us": tables.now_us(),
                },
            )
            stored = conn.execute(
                select(pins.c.surface).where(
                    pins.c.run_id == run_id, pins.c.turn_start == turn_start
                )
            ).scalar_one()
        return str(stored).encode()

    def list_records(
        self,
        run_id: str,
        after_sequence: int,
        kinds: tuple[RecordKind, ...],
        limit: int,
        max_bytes: int,
    ) -> tuple[list[StoredRecord], bool]:
        records = tables.records
        query = select(records).where(
            records.c.run_id == run_id, records.c.sequence > after_sequence
        )
        if kinds:
            query = query.where(records.c.kind.in_([kind.value for kind in kinds]))
        with read_transaction(self._engine) as conn:
            # One row past the page tells whether another page follows.
            rows = conn.execute(query.order_by(records.c.sequence).limit(limit + 1)).all()
            kept, total = 0, 0
            for row in rows[:limit]:
                total += row.content_bytes
                if total > max_bytes and kept > 0:
                    break
                kept += 1
            more = len(rows) > kept
            rows = rows[:kept]
            if not rows:
                return [], False
            content = records_content(conn, run_id, [row.sequence for row in rows])
        return [
            StoredRecord(
                run_id=run_id,
                sequence=row.sequence,
                create_time=tables.from_us(row.create_time_us),
                handle=row.handle or "",
                record=Record(
                    kind=RecordKind(row.kind),
                    content=tuple(content[row.sequence]),
                    tool_calls=tuple(ToolCall(*call) for call in json.loads(row.tool_calls)),
                    call_id=row.call_id,
                    server=row.server,
                    tool=row.tool,
                    is_error=row.is_error,
                ),
            )
            for row in rows
        ], more


class StoredSurfacePins:
    """The domain's SurfacePins for a reader that must not write (``inspect
    --database-url``): the turn's stored pin when a sidecar made one (SqlStore.pin_surface),
    else the surface just resolved, stored nowhere."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def pin_surface(self, run_id: str, turn_start: int, surface_json: bytes) -> bytes:
        pins = tables.turn_surfaces
        query = select(pins.c.surface).where(
            pins.c.run_id == run_id, pins.c.turn_start == turn_start
        )
        with read_transaction(self._engine) as conn:
            stored = conn.execute(query).scalar()
        return surface_json if stored is None else str(stored).encode()


def _select_runs(
    engine: Engine, tenant: str | AllTenants, after_run_id: str, limit: int, with_activity: bool
) -> tuple[list[Row[Any]], bool]:
    """The rows of `list_runs`: the Run's row; `with_activity`, plus `last_activity_us`, the
    time of its last record (its create time before any): one primary-key lookup per Run,
    which ListRuns does not pay (~50% more per page on SQLite)."""
    runs, records = tables.runs, tables.records
    one_tenant = tenant if isinstance(tenant, str) else None
    if with_activity:
        last = func.coalesce(records.c.create_time_us, runs.c.create_time_us)
        query = select(runs, last.label("last_activity_us")).select_from(
            runs.outerjoin(
                records,
                and_(
                    records.c.run_id == runs.c.run_id,
                    records.c.sequence == runs.c.last_sequence,
                ),
            )
        )
    else:
        query = select(runs)
    if one_tenant is not None:
        query = query.where(runs.c.tenant == one_tenant)
    with read_transaction(engine) as conn:
        if after_run_id:
            position = select(runs.c.create_time_us).where(runs.c.run_id == after_run_id)
            if one_tenant is not None:
                position = position.where(runs.c.tenant == one_tenant)
            after = conn.execute(position).scalar()
            if after is None:
                return [], False
            query = query.where(
                or_(
                    runs.c.create_time_us < after,
                    and_(runs.c.create_time_us == after, runs.c.run_id < after_run_id),
                )
            )
        order = (runs.c.create_time_us.desc(), runs.c.run_id.desc())
        rows = conn.execute(query.order_by(*order).limit(limit + 1)).all()
    return list(rows[:limit]), len(rows) > limit


def _run(row: Row[Any]) -> Run:
    return Run(
        run_id=row.run_id,
        tenant=row.tenant,
        spec_name=row.spec_name,
        spec_version=row.spec_version,
        tool_restrictions=tuple(ToolGrant(s, t) for s, t in json.loads(row.tool_restrictions)),
        create_time=tables.from_us(row.create_time_us),
    )

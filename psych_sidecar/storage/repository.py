"""SqlStore: the domain's repositories over SQLAlchemy Core, for SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    and_,
    func,
    insert,
    or_,
    select,
)
from sqlalchemy.exc import IntegrityError

from psych_sidecar.bulk.slices import utf8_char_count
from psych_sidecar.domain.errors import RequestIdReused, run_not_found
from psych_sidecar.domain.runlog import (
    AllTenants,
    AppendedRecord,
    CallResultOutline,
    ContentPart,
    ListedRun,
    PartKind,
    PublishedSpec,
    Record,
    RecordedCall,
    RecordKind,
    Run,
    Spec,
    StoredRecord,
    ToolCall,
    ToolGrant,
)
from psych_sidecar.storage import tables
from psych_sidecar.storage.bulk_values import (
    large_value,
    large_value_columns,
    stream_into_row,
    streamed_later,
)
from psych_sidecar.storage.loop_connection import LoopConnection
from psych_sidecar.storage.statements import driver_statements, insert_ignoring_conflicts
from psych_sidecar.storage.transactions import driver_write, plain_select, transaction


class _AlreadyAppended(Exception):
    """A request id already used in the Run: unwinds the transaction (and the sequences it
    reserved) and carries the first append's fingerprint and answer."""

    def __init__(self, fingerprint: str, result: str) -> None:
        super().__init__(fingerprint)
        self.fingerprint = fingerprint
        self.result = result


def _execute_rows(cursor: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """One statement per row: `execute` for the one row of most appends (psycopg's
    `executemany` enters pipeline mode, a round trip more for a single row)."""
    if len(rows) == 1:
        cursor.execute(sql, rows[0])
    elif rows:
        cursor.executemany(sql, rows)


class SqlStore:
    """Implements SpecRepository and RunRepository. Every method is one transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._append_sql = driver_statements(engine)

    # Specs

    def insert_spec(self, spec: Spec) -> PublishedSpec:
        existing = self.get_spec(spec.name, spec.version)
        if existing is not None:
            return existing
        now = tables.now_us()
        try:
            with transaction(self._engine, write=True) as conn:
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
        with transaction(self._engine, write=False) as conn:
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
        with transaction(self._engine, write=True) as conn:
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
        with transaction(self._engine, write=False) as conn:
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
        with transaction(self._engine, write=False) as conn:
            return [str(tenant) for (tenant,) in conn.execute(query)]

    def append_records(
        self,
        run_id: str,
        records: Sequence[Record],
        handles: Sequence[str],
        request_id: str,
        fingerprint: str,
        call_result: CallResultOutline | None = None,
    ) -> list[AppendedRecord]:
        outline = None if call_result is None else call_result.outline
        streamed = _streamed_parts(records)
        try:
            with driver_write(self._engine) as (cursor, conn):
                last, appended = self._append_rows(
                    cursor, run_id, records, handles, request_id, fingerprint, call_result
                )
                if streamed_later(outline) or streamed:
                    self._stream_values(conn, run_id, request_id, outline, last, streamed)
        except _AlreadyAppended as retry:
            return _first_answer(retry, run_id, request_id, fingerprint)
        return appended

    def append_records_now(
        self,
        loop: LoopConnection,
        run_id: str,
        records: Sequence[Record],
        handles: Sequence[str],
        request_id: str,
        fingerprint: str,
        call_result: CallResultOutline | None = None,
    ) -> list[AppendedRecord] | None:
        """`append_records` on the event loop's connection, or None when not now (nothing
        appended). Values streamed into their rows are never now: that takes a SQLAlchemy
        connection, and time that grows with the value."""
        outline = None if call_result is None else call_result.outline
        if streamed_later(outline) or _streamed_parts(records):
            return None
        try:
            written = loop.write_now(
                lambda cursor: self._append_rows(
                    cursor, run_id, records, handles, request_id, fingerprint, call_result
                )
            )
        except _AlreadyAppended as retry:
            return _first_answer(retry, run_id, request_id, fingerprint)
        return None if written is None else written[1]

    def _append_rows(
        self,
        cursor: Any,
        run_id: str,
        records: Sequence[Record],
        handles: Sequence[str],
        request_id: str,
        fingerprint: str,
        call_result: CallResultOutline | None,
    ) -> tuple[int, list[AppendedRecord]]:
        """The append's statements on a DB-API cursor in a write transaction (a pooled one or
        the loop's): the sequence before the first record, and the records appended. Values
        streamed later are bound empty. Raises _AlreadyAppended for a request id used before,
        RUN_NOT_FOUND for an unknown Run."""
        sql = self._append_sql
        outline = None if call_result is None else call_result.outline
        # One statement locks the Run's row, which serialises appends to it (across
        # sidecars too), and reserves the sequence numbers; a rollback returns them.
        row = cursor.execute(sql.reserve, (len(records), run_id)).fetchone()
        if row is None:
            raise run_not_found(run_id)
        last = int(row[0]) - len(records)
        appended = [
            AppendedRecord(last + offset, handle) for offset, handle in enumerate(handles, start=1)
        ]
        if request_id:
            claimed = cursor.execute(
                sql.claim,
                (
                    run_id,
                    request_id,
                    fingerprint,
                    json.dumps([[e.sequence, e.handle] for e in appended]),
                    b"" if streamed_later(outline) else outline,
                    None if call_result is None else call_result.splices_json(),
                ),
            ).fetchone()
            if claimed is None:
                prior_fingerprint, prior_result = cursor.execute(
                    sql.prior, (run_id, request_id)
                ).fetchone()
                raise _AlreadyAppended(prior_fingerprint, prior_result)
        now = tables.now_us()
        _execute_rows(
            cursor,
            sql.record,
            [
                (
                    run_id,
                    entry.sequence,
                    record.kind.value,
                    now,
                    entry.handle or None,
                    record.call_id,
                    record.server,
                    record.tool,
                    record.is_error,
                    json.dumps(
                        [[c.call_id, c.name, c.arguments_json] for c in record.tool_calls],
                        ensure_ascii=False,
                    ),
                    sum(len(part.data) for part in record.content),
                )
                for record, entry in zip(records, appended, strict=True)
            ],
        )
        parts = [
            (
                run_id,
                entry.sequence,
                index,
                part.kind.value,
                part.mime_type,
                b"" if streamed_later(part.data) else part.data,
                None if part.kind is PartKind.BINARY else utf8_char_count(part.data),
            )
            for record, entry in zip(records, appended, strict=True)
            for index, part in enumerate(record.content)
        ]
        _execute_rows(cursor, sql.part, parts)
        return last, appended

    @staticmethod
    def _stream_values(
        conn: Connection,
        run_id: str,
        request_id: str,
        outline: bytes | None,
        last: int,
        streamed: list[tuple[int, int, bytes]],
    ) -> None:
        """Values over a MiB, bound empty with their rows, written in (`stream_into_row`)."""
        requests, parts = tables.append_requests, tables.record_parts
        if outline is not None and streamed_later(outline):
            stream_into_row(
                conn,
                requests.c.call_result_outline,
                (requests.c.run_id == run_id, requests.c.request_id == request_id),
                outline,
            )
        for offset, index, data in streamed:
            where = (
                parts.c.run_id == run_id,
                parts.c.sequence == last + offset,
                parts.c.part_index == index,
            )
            stream_into_row(conn, parts.c.data, where, data)

    def call_unrecorded_now(self, loop: LoopConnection, run_id: str, request_id: str) -> bool:
        """On the event loop's connection: True when it is known now that `recorded_call`
        would answer None (the first check it makes)."""
        return loop.select_now(self._append_sql.recorded, (run_id, request_id)) == []

    def recorded_call(self, run_id: str, request_id: str) -> RecordedCall | None:
        # Every tool call asks, and nearly always hears no: that answer is one plain SELECT.
        if not plain_select(self._engine, self._append_sql.recorded, (run_id, request_id)):
            return None
        requests, records = tables.append_requests, tables.records
        with transaction(self._engine, write=False) as conn:
            outline = large_value_columns(conn, requests.c.call_result_outline)
            row = conn.execute(
                select(requests.c.result, requests.c.call_result_splices, *outline).where(
                    requests.c.run_id == run_id,
                    requests.c.request_id == request_id,
                    requests.c.call_result_outline.is_not(None),
                )
            ).one()
            ((sequence, handle),) = json.loads(row.result)
            is_error = conn.execute(
                select(records.c.is_error).where(
                    records.c.run_id == run_id, records.c.sequence == sequence
                )
            ).scalar_one()
            call_result = CallResultOutline.stored(
                large_value(conn, requests.c.call_result_outline, row), row.call_result_splices
            )
            # The parts only when the outline needs them back (a result too small to cut
            # holds them itself).
            content = _record_content(conn, run_id, sequence) if call_result.splices else []
        return RecordedCall(sequence, handle, bool(is_error), call_result.result_json(content))

    def pin_surface(self, run_id: str, turn_start: int, surface_json: bytes) -> bytes:
        pins = tables.turn_surfaces
        with transaction(self._engine, write=True) as conn:
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
        with transaction(self._engine, write=False) as conn:
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
            content = _records_content(conn, run_id, [row.sequence for row in rows])
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
        with transaction(self._engine, write=False) as conn:
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
    with transaction(engine, write=False) as conn:
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


def _records_content(
    conn: Connection, run_id: str, sequences: list[int]
) -> dict[int, list[ContentPart]]:
    """The content parts of these records, in order, by sequence."""
    parts = tables.record_parts
    content: dict[int, list[ContentPart]] = {sequence: [] for sequence in sequences}
    for part in conn.execute(
        select(
            parts.c.sequence,
            parts.c.kind,
            parts.c.mime_type,
            *large_value_columns(conn, parts.c.data),
        )
        .where(parts.c.run_id == run_id, parts.c.sequence.in_(sequences))
        .order_by(parts.c.sequence, parts.c.part_index)
    ).all():
        data = large_value(conn, parts.c.data, part)
        content[part.sequence].append(ContentPart(PartKind(part.kind), data, part.mime_type))
    return content


def _record_content(conn: Connection, run_id: str, sequence: int) -> list[ContentPart]:
    return _records_content(conn, run_id, [sequence])[sequence]


def _run(row: Row[Any]) -> Run:
    return Run(
        run_id=row.run_id,
        tenant=row.tenant,
        spec_name=row.spec_name,
        spec_version=row.spec_version,
        tool_restrictions=tuple(ToolGrant(s, t) for s, t in json.loads(row.tool_restrictions)),
        create_time=tables.from_us(row.create_time_us),
    )


def _streamed_parts(records: Sequence[Record]) -> list[tuple[int, int, bytes]]:
    """The parts whose values are streamed into their rows after the append's statements:
    (the record's offset from 1, the part's index, the value)."""
    return [
        (sequence_offset, index, part.data)
        for sequence_offset, record in enumerate(records, start=1)
        for index, part in enumerate(record.content)
        if streamed_later(part.data)
    ]


def _first_answer(
    retry: _AlreadyAppended, run_id: str, request_id: str, fingerprint: str
) -> list[AppendedRecord]:
    """The first append's answer to a retry with the same records; REQUEST_ID_REUSED for
    different ones."""
    if retry.fingerprint != fingerprint:
        raise RequestIdReused(
            f"request id {request_id!r} was already used in this run for different records",
            run_id=run_id,
            request_id=request_id,
        ) from None
    return [AppendedRecord(s, h) for s, h in json.loads(retry.result)]

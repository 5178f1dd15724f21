"""SqlStore: the domain's repositories over SQLAlchemy Core, for SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Engine,
    Insert,
    Row,
    Table,
    and_,
    case,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from psych_sidecar.bulk.slices import utf8_char_count
from psych_sidecar.domain.errors import Reason, SidecarError, run_not_found
from psych_sidecar.domain.runlog import (
    AppendedRecord,
    ContentPart,
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
from psych_sidecar.storage.db import transaction


class _AlreadyAppended(Exception):
    """A request id already used in the Run: unwinds the transaction (and the sequences it
    reserved) and carries the first append's fingerprint and answer."""

    def __init__(self, fingerprint: str, result: str) -> None:
        super().__init__(fingerprint)
        self.fingerprint = fingerprint
        self.result = result


class SqlStore:
    """Implements SpecRepository and RunRepository. Every method is one transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

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

    def list_runs(self, tenant: str, after_run_id: str, limit: int) -> tuple[list[Run], bool]:
        rows, more = select_runs(self._engine, tenant, after_run_id, limit)
        return [_run(row) for row in rows], more

    def append_records(
        self,
        run_id: str,
        records: Sequence[Record],
        handles: Sequence[str],
        request_id: str,
        fingerprint: str,
        call_result_json: bytes | None = None,
    ) -> list[AppendedRecord]:
        runs, requests = tables.runs, tables.append_requests
        try:
            with transaction(self._engine, write=True) as conn:
                # One statement locks the Run's row, which serialises appends to it (across
                # sidecars too), and reserves the sequence numbers; a rollback returns them.
                last = conn.execute(
                    update(runs)
                    .where(runs.c.run_id == run_id)
                    .values(last_sequence=runs.c.last_sequence + len(records))
                    .returning(runs.c.last_sequence)
                ).scalar()
                if last is None:
                    raise run_not_found(run_id)
                last -= len(records)
                appended = [
                    AppendedRecord(last + offset, handle)
                    for offset, handle in enumerate(handles, start=1)
                ]
                if request_id:
                    streamed = _streamed_later(call_result_json)
                    claimed = conn.execute(
                        self._insert_ignoring_conflicts(requests)
                        .values(
                            run_id=run_id,
                            request_id=request_id,
                            fingerprint=fingerprint,
                            result=json.dumps([[e.sequence, e.handle] for e in appended]),
                            call_result_json=b"" if streamed else call_result_json,
                        )
                        .returning(requests.c.request_id)
                    ).first()
                    if claimed is None:
                        prior = conn.execute(
                            select(requests.c.fingerprint, requests.c.result).where(
                                requests.c.run_id == run_id, requests.c.request_id == request_id
                            )
                        ).one()
                        raise _AlreadyAppended(prior.fingerprint, prior.result)
                    if streamed and call_result_json is not None:
                        _stream_blob(
                            conn,
                            requests.c.call_result_json,
                            (requests.c.run_id == run_id, requests.c.request_id == request_id),
                            call_result_json,
                        )
                self._insert_records(conn, run_id, records, appended)
        except _AlreadyAppended as retry:
            if retry.fingerprint != fingerprint:
                raise SidecarError(
                    Reason.REQUEST_ID_REUSED,
                    f"request id {request_id!r} was already used in this run for different records",
                    run_id=run_id,
                    request_id=request_id,
                ) from None
            return [AppendedRecord(s, h) for s, h in json.loads(retry.result)]
        return appended

    def recorded_call(self, run_id: str, request_id: str) -> RecordedCall | None:
        requests, records = tables.append_requests, tables.records
        with transaction(self._engine, write=False) as conn:
            row = conn.execute(
                select(requests.c.result, *_blob_read(conn, requests.c.call_result_json)).where(
                    requests.c.run_id == run_id,
                    requests.c.request_id == request_id,
                    requests.c.call_result_json.is_not(None),
                )
            ).first()
            if row is None:
                return None
            ((sequence, handle),) = json.loads(row.result)
            is_error = conn.execute(
                select(records.c.is_error).where(
                    records.c.run_id == run_id, records.c.sequence == sequence
                )
            ).scalar_one()
            result_json = _blob_value(conn, requests.c.call_result_json, row)
        return RecordedCall(sequence, handle, bool(is_error), result_json)

    def pin_surface(self, run_id: str, turn_start: int, surface_json: bytes) -> bytes:
        pins = tables.turn_surfaces
        with transaction(self._engine, write=True) as conn:
            conn.execute(
                self._insert_ignoring_conflicts(pins),
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

    def _insert_ignoring_conflicts(self, table: Table) -> Insert:
        """INSERT … ON CONFLICT DO NOTHING, in the engine's dialect."""
        if self._engine.dialect.name == "postgresql":
            return postgresql.insert(table).on_conflict_do_nothing()
        return sqlite.insert(table).on_conflict_do_nothing()

    @staticmethod
    def _insert_records(
        conn: Connection,
        run_id: str,
        records: Sequence[Record],
        appended: list[AppendedRecord],
    ) -> None:
        now = tables.now_us()
        conn.execute(
            insert(tables.records),
            [
                {
                    "run_id": run_id,
                    "sequence": entry.sequence,
                    "kind": record.kind.value,
                    "create_time_us": now,
                    "handle": entry.handle or None,
                    "call_id": record.call_id,
                    "server": record.server,
                    "tool": record.tool,
                    "is_error": record.is_error,
                    "tool_calls": json.dumps(
                        [[c.call_id, c.name, c.arguments_json] for c in record.tool_calls],
                        ensure_ascii=False,
                    ),
                    "content_bytes": sum(len(part.data) for part in record.content),
                }
                for record, entry in zip(records, appended, strict=True)
            ],
        )
        parts = tables.record_parts
        part_rows = []
        streamed: list[tuple[int, int, bytes]] = []
        for record, entry in zip(records, appended, strict=True):
            for index, part in enumerate(record.content):
                later = _streamed_later(part.data)
                if later:
                    streamed.append((entry.sequence, index, part.data))
                part_rows.append(
                    {
                        "run_id": run_id,
                        "sequence": entry.sequence,
                        "part_index": index,
                        "kind": part.kind.value,
                        "mime_type": part.mime_type,
                        "data": b"" if later else part.data,
                        "char_count": None
                        if part.kind is PartKind.BINARY
                        else utf8_char_count(part.data),
                    }
                )
        if part_rows:
            conn.execute(insert(parts), part_rows)
        for sequence, index, data in streamed:
            where = (
                parts.c.run_id == run_id,
                parts.c.sequence == sequence,
                parts.c.part_index == index,
            )
            _stream_blob(conn, parts.c.data, where, data)

    def list_records(
        self,
        run_id: str,
        after_sequence: int,
        kinds: tuple[RecordKind, ...],
        limit: int,
        max_bytes: int,
    ) -> tuple[list[StoredRecord], bool]:
        records, parts = tables.records, tables.record_parts
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
            content: dict[int, list[ContentPart]] = {row.sequence: [] for row in rows}
            for part in conn.execute(
                select(
                    parts.c.sequence,
                    parts.c.kind,
                    parts.c.mime_type,
                    *_blob_read(conn, parts.c.data),
                )
                .where(
                    parts.c.run_id == run_id,
                    parts.c.sequence.in_([row.sequence for row in rows]),
                )
                .order_by(parts.c.sequence, parts.c.part_index)
            ).all():
                data = _blob_value(conn, parts.c.data, part)
                content[part.sequence].append(
                    ContentPart(PartKind(part.kind), data, part.mime_type)
                )
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


def select_runs(
    engine: Engine, tenant: str, after_run_id: str, limit: int, activity: bool = False
) -> tuple[list[Row[Any]], bool]:
    """The one query that lists Runs (ListRuns' pages and the inspectors' lists): a tenant's
    Runs, or (tenant empty) every tenant's, newest first (create time, then id, descending),
    at most `limit` of them after the Run `after_run_id` in that order (from the first when
    empty), and whether more remain. Each row is the Run's row; with `activity`, plus
    `last_activity_us`, the time of its last record (its create time before any): one
    primary-key lookup per Run, which ListRuns does not pay (~50% more per page on SQLite)."""
    runs, records = tables.runs, tables.records
    if activity:
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
    if tenant:
        query = query.where(runs.c.tenant == tenant)
    with transaction(engine, write=False) as conn:
        if after_run_id:
            position = select(runs.c.create_time_us).where(runs.c.run_id == after_run_id)
            if tenant:
                position = position.where(runs.c.tenant == tenant)
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


# A bound value is copied while its caller holds the GIL: binding 50 MB stalled every other
# thread, the event loop's included, for ~25 ms on SQLite, and 25-30 ms through psycopg on
# PostgreSQL. A value this large is bound empty and written into its row after, a MiB per
# call, each call short (worst pause of a 1 ms ticker beside 50 MB writes: SQLite ~28 ms ->
# ~8 ms; PostgreSQL 26-32 ms -> 1.4-4.8 ms, and the write ~15 % quicker).
_STREAMED_BLOB_BYTES = 1 << 20
# PostgreSQL's binary COPY format around one row of one bytea field.
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
_COPY_TRAILER = (-1).to_bytes(2, "big", signed=True)
# Where a large value waits on PostgreSQL before the UPDATE that moves it into its row: one
# per session, emptied by that UPDATE's DELETE and, failing that, at commit.
_INCOMING = "psych_incoming_value"


def _streamed_later(data: bytes | None) -> bool:
    """Whether `data` is bound empty now and streamed into its row after (_stream_blob)."""
    return data is not None and len(data) > _STREAMED_BLOB_BYTES


def _stream_blob(
    conn: Connection, column: Column[bytes], where: Sequence[ColumnElement[bool]], data: bytes
) -> None:
    """Writes `data` into `column` of the one row `where` selects, in this transaction, a MiB
    per call. SQLite: sized with zeroblob() (SQLite fills it in, GIL released), then written
    through an incremental blob handle. PostgreSQL: copied (binary COPY) into a temporary
    table of this session, then moved into the row by the server."""
    if conn.dialect.name == "postgresql":
        _stream_blob_postgresql(conn, column, where, data)
        return
    table = column.table
    conn.execute(update(table).where(*where).values({column.name: func.zeroblob(len(data))}))
    rowid: int = conn.execute(
        select(literal_column("rowid")).select_from(table).where(*where)
    ).scalar_one()
    driver = conn.connection.driver_connection
    assert driver is not None
    view = memoryview(data)
    with driver.blobopen(table.name, column.name, rowid) as blob:
        for start in range(0, len(data), _STREAMED_BLOB_BYTES):
            blob.write(view[start : start + _STREAMED_BLOB_BYTES])


def _stream_blob_postgresql(
    conn: Connection, column: Column[bytes], where: Sequence[ColumnElement[bool]], data: bytes
) -> None:
    conn.execute(
        text(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {_INCOMING} (value bytea NOT NULL) "
            "ON COMMIT DELETE ROWS"
        )
    )
    driver = conn.connection.driver_connection
    assert driver is not None
    view = memoryview(data)
    one_field_of = (1).to_bytes(2, "big") + len(data).to_bytes(4, "big")
    with (
        driver.cursor() as cursor,
        cursor.copy(f"COPY {_INCOMING} (value) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.write(_COPY_SIGNATURE + one_field_of)
        for start in range(0, len(data), _STREAMED_BLOB_BYTES):
            copy.write(view[start : start + _STREAMED_BLOB_BYTES])
        copy.write(_COPY_TRAILER)
    incoming: ColumnElement[bytes] = literal_column(f"(SELECT value FROM {_INCOMING})")
    conn.execute(update(column.table).where(*where).values({column.name: incoming}))
    conn.execute(text(f"DELETE FROM {_INCOMING}"))


def _blob_read(conn: Connection, column: Column[bytes]) -> list[ColumnElement[Any]]:
    """The columns that read `column` as `value`. On SQLite a value over a MiB is not read
    with the row: fetching it copies it whole with the GIL held (~27 ms for 50 MB). Its row
    gives its size and rowid instead, and `_blob_value` reads it through a blob handle, a MiB
    per call. (On PostgreSQL the bytea loader slices it, storage/db.py.)"""
    if conn.dialect.name != "sqlite":
        return [column.label("value")]
    size = func.length(column)
    return [
        case((size > _STREAMED_BLOB_BYTES, null()), else_=column).label("value"),
        size.label("size"),
        literal_column(f"{column.table.name}.rowid").label("rowid"),
    ]


def _blob_value(conn: Connection, column: Column[bytes], row: Row[Any]) -> bytes:
    """The value a row selected with `_blob_read` holds, read now if it was left out."""
    if row.value is not None:
        return bytes(row.value)
    driver = conn.connection.driver_connection
    assert driver is not None
    table = column.table
    pieces = []
    with driver.blobopen(table.name, column.name, row.rowid, readonly=True) as blob:
        for _ in range(0, row.size, _STREAMED_BLOB_BYTES):
            pieces.append(blob.read(_STREAMED_BLOB_BYTES))
    return b"".join(pieces)

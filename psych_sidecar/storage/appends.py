"""The Run log's append path: records and their parts written with the driver's statements
(statements.py) on a pooled connection or the event loop's, values over a MiB streamed into
their rows, and a tool call's recorded answer read back by its request id."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, select

from psych_sidecar.bulk.slices import utf8_char_count
from psych_sidecar.domain.errors import RequestIdReused, run_not_found
from psych_sidecar.domain.runlog import (
    AppendedRecord,
    CallResultOutline,
    ContentPart,
    PartKind,
    PendingAppend,
    Record,
    RecordedCall,
)
from psych_sidecar.storage import tables
from psych_sidecar.storage.bulk_values import (
    large_value,
    large_value_columns,
    stream_into_row,
    streamed_later,
)
from psych_sidecar.storage.loop_connection import LoopConnection
from psych_sidecar.storage.statements import driver_statements
from psych_sidecar.storage.transactions import driver_write, plain_select, read_transaction


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


class RecordAppends:
    """RunRepository's append path (`append_records`, `recorded_call`) and its variants on the
    event loop's connection. Every method is one transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._append_sql = driver_statements(engine)

    def append_records(self, append: PendingAppend) -> list[AppendedRecord]:
        run_id, request_id = append.run_id, append.request_id
        outline = None if append.call_result is None else append.call_result.outline
        streamed = _streamed_parts(append.records)
        try:
            with driver_write(self._engine) as (cursor, conn):
                last, appended = self._append_rows(cursor, append)
                if streamed_later(outline) or streamed:
                    self._stream_values(conn, run_id, request_id, outline, last, streamed)
        except _AlreadyAppended as retry:
            return _first_answer(retry, append)
        return appended

    def append_records_now(
        self, loop: LoopConnection, append: PendingAppend
    ) -> list[AppendedRecord] | None:
        """`append_records` on the event loop's connection, or None when not now (nothing
        appended). Values streamed into their rows are never now: that takes a SQLAlchemy
        connection, and time that grows with the value."""
        outline = None if append.call_result is None else append.call_result.outline
        if streamed_later(outline) or _streamed_parts(append.records):
            return None
        try:
            written = loop.write_now(lambda cursor: self._append_rows(cursor, append))
        except _AlreadyAppended as retry:
            return _first_answer(retry, append)
        return None if written is None else written[1]

    def _append_rows(self, cursor: Any, append: PendingAppend) -> tuple[int, list[AppendedRecord]]:
        """The append's statements on a DB-API cursor in a write transaction (a pooled one or
        the loop's): the sequence before the first record, and the records appended. Values
        streamed later are bound empty. Raises _AlreadyAppended for a request id used before,
        RUN_NOT_FOUND for an unknown Run."""
        sql = self._append_sql
        run_id, records, request_id = append.run_id, append.records, append.request_id
        call_result = append.call_result
        outline = None if call_result is None else call_result.outline
        # One statement locks the Run's row, which serialises appends to it (across
        # sidecars too), and reserves the sequence numbers; a rollback returns them.
        row = cursor.execute(sql.reserve, (len(records), run_id)).fetchone()
        if row is None:
            raise run_not_found(run_id)
        last = int(row[0]) - len(records)
        appended = [
            AppendedRecord(last + offset, handle)
            for offset, handle in enumerate(append.handles, start=1)
        ]
        if request_id:
            claimed = cursor.execute(
                sql.claim,
                (
                    run_id,
                    request_id,
                    append.fingerprint,
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
        would answer None (the first check it makes), and the call waits for no input (a
        waiting call is answered from its round, on the storage threads)."""
        return (
            loop.select_now(
                self._append_sql.recorded_or_waiting, (run_id, request_id, run_id, request_id)
            )
            == []
        )

    def recorded_call(self, run_id: str, request_id: str) -> RecordedCall | None:
        # Every tool call asks, and nearly always hears no: that answer is one plain SELECT.
        if not plain_select(self._engine, self._append_sql.recorded, (run_id, request_id)):
            return None
        requests, records = tables.append_requests, tables.records
        with read_transaction(self._engine) as conn:
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


def records_content(
    conn: Connection, run_id: str, sequences: list[int]
) -> dict[int, list[ContentPart]]:
    """The content parts of these records, in order, by sequence (a recorded call's here, a page
    of SqlStore.list_records')."""
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
    return records_content(conn, run_id, [sequence])[sequence]


def _streamed_parts(records: Sequence[Record]) -> list[tuple[int, int, bytes]]:
    """The parts whose values are streamed into their rows after the append's statements:
    (the record's offset from 1, the part's index, the value)."""
    return [
        (sequence_offset, index, part.data)
        for sequence_offset, record in enumerate(records, start=1)
        for index, part in enumerate(record.content)
        if streamed_later(part.data)
    ]


def _first_answer(retry: _AlreadyAppended, append: PendingAppend) -> list[AppendedRecord]:
    """The first append's answer to a retry with the same records; REQUEST_ID_REUSED for
    different ones."""
    if retry.fingerprint != append.fingerprint:
        raise RequestIdReused(
            f"request id {append.request_id!r} was already used in this run for different records",
            run_id=append.run_id,
            request_id=append.request_id,
        ) from None
    return [AppendedRecord(s, h) for s, h in json.loads(retry.result)]

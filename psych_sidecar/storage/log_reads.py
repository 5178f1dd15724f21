"""Reads of the Run log for prompt assembly and tool-output reads: metadata, byte ranges and
only the content that will be sent.

Byte ranges are read without loading whole parts: on SQLite through incremental blob I/O
(with the database memory-mapped, reaching the end of a long part follows its page chain
without copying it), on PostgreSQL with `substr` on the `bytea` column.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Integer,
    Select,
    and_,
    column,
    func,
    literal_column,
    select,
    tuple_,
    values,
)

from psych_sidecar.domain.runlog import (
    ByteRange,
    ContentPart,
    PartKind,
    PartMeta,
    RecordKind,
    RecordSkeleton,
    ToolCall,
)
from psych_sidecar.storage import tables
from psych_sidecar.storage.loop_connection import LoopConnection
from psych_sidecar.storage.statements import driver_statements
from psych_sidecar.storage.transactions import plain_select, read_transaction

# Bound the number of bound parameters per statement (SQLite allows 32766).
_CHUNK = 500


def _chunks(values: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), _CHUNK):
        yield values[start : start + _CHUNK]


class SqlLogReader:
    """Implements the domain's LogReader over SQLAlchemy Core."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sqlite = engine.dialect.name == "sqlite"
        self._latest_of_kind_sql = driver_statements(engine).latest_of_kind

    def record_skeletons(self, run_id: str) -> list[RecordSkeleton]:
        query = _skeletons().where(tables.records.c.run_id == run_id)
        with read_transaction(self._engine) as conn:
            return _skeleton_rows(conn.execute(query).all())

    def record_skeletons_between(
        self, run_id: str, first: int, last: int, limit: int
    ) -> list[RecordSkeleton]:
        r = tables.records
        # The primary key's range: as many rows as asked, whatever the Run's length.
        query = (
            _skeletons()
            .where(r.c.run_id == run_id, r.c.sequence >= first, r.c.sequence <= last)
            .limit(limit)
        )
        with read_transaction(self._engine) as conn:
            return _skeleton_rows(conn.execute(query).all())

    def turn_of(self, run_id: str, sequence: int) -> int:
        r = tables.records
        # A count over ix_records_run_kind: one row back, not the Run's records.
        query = select(func.count()).where(
            r.c.run_id == run_id,
            r.c.kind == RecordKind.USER_MESSAGE.value,
            r.c.sequence <= sequence,
        )
        with read_transaction(self._engine) as conn:
            return int(conn.execute(query).scalar_one())

    def turn_starts(self, run_id: str, turn: int, count: int) -> list[int]:
        r = tables.records
        # The turn's user message by its rank on ix_records_run_kind: `count` rows back.
        query = (
            select(r.c.sequence)
            .where(r.c.run_id == run_id, r.c.kind == RecordKind.USER_MESSAGE.value)
            .order_by(r.c.sequence)
            .offset(turn - 1)
            .limit(count)
        )
        with read_transaction(self._engine) as conn:
            return [int(sequence) for sequence in conn.execute(query).scalars()]

    def latest_compaction_sequence(self, run_id: str) -> int:
        return self._latest_of_kind(run_id, RecordKind.COMPACTION)

    def part_metas(self, run_id: str, sequences: Sequence[int]) -> dict[int, list[PartMeta]]:
        p = tables.record_parts
        metas: dict[int, list[PartMeta]] = {}
        with read_transaction(self._engine) as conn:
            for chunk in _chunks(sorted(set(sequences))):
                query = (
                    select(
                        p.c.sequence,
                        p.c.part_index,
                        p.c.kind,
                        p.c.mime_type,
                        func.length(p.c.data).label("byte_length"),
                        p.c.char_count,
                    )
                    .where(p.c.run_id == run_id, p.c.sequence.in_(chunk))
                    .order_by(p.c.sequence, p.c.part_index)
                )
                for row in conn.execute(query):
                    metas.setdefault(row.sequence, []).append(
                        PartMeta(
                            row.part_index,
                            PartKind(row.kind),
                            row.mime_type,
                            row.byte_length,
                            row.char_count,
                        )
                    )
        return metas

    def read_ranges(self, run_id: str, ranges: Sequence[ByteRange]) -> list[bytes]:
        if not ranges:
            return []
        with read_transaction(self._engine) as conn:
            if self._sqlite:
                return self._sqlite_ranges(conn, run_id, ranges)
            return self._sql_ranges(conn, run_id, ranges)

    def _sqlite_ranges(
        self, conn: Connection, run_id: str, ranges: Sequence[ByteRange]
    ) -> list[bytes]:
        p = tables.record_parts
        keys = sorted({(r.sequence, r.part_index) for r in ranges})
        rowids: dict[tuple[int, int], int] = {}
        for chunk in _chunks(keys):
            query = select(p.c.sequence, p.c.part_index, literal_column("rowid")).where(
                p.c.run_id == run_id, tuple_(p.c.sequence, p.c.part_index).in_(chunk)
            )
            for sequence, part_index, rowid in conn.execute(query):
                rowids[(sequence, part_index)] = rowid
        sqlite = conn.connection.driver_connection
        assert sqlite is not None
        out = []
        for wanted in ranges:
            if wanted.length <= 0:
                out.append(b"")
                continue
            rowid = rowids[(wanted.sequence, wanted.part_index)]
            with sqlite.blobopen("record_parts", "data", rowid, readonly=True) as blob:
                blob.seek(wanted.start)
                out.append(blob.read(wanted.length))
        return out

    def _sql_ranges(
        self, conn: Connection, run_id: str, ranges: Sequence[ByteRange]
    ) -> list[bytes]:
        p = tables.record_parts
        out = [b""] * len(ranges)
        wanted = [(i, r) for i, r in enumerate(ranges) if r.length > 0]
        for chunk in _chunks(wanted):
            # One statement per chunk: the ranges as a VALUES list joined to their parts.
            asked = values(
                column("position", Integer),
                column("sequence", BigInteger),
                column("part_index", Integer),
                column("start", Integer),
                column("length", Integer),
                name="asked",
            ).data([(i, r.sequence, r.part_index, r.start + 1, r.length) for i, r in chunk])
            query = select(
                asked.c.position, func.substr(p.c.data, asked.c.start, asked.c.length)
            ).join(
                p,
                and_(
                    p.c.run_id == run_id,
                    p.c.sequence == asked.c.sequence,
                    p.c.part_index == asked.c.part_index,
                ),
            )
            for position, data in conn.execute(query):
                out[position] = bytes(data)
        return out

    def record_contents(
        self, run_id: str, sequences: Sequence[int]
    ) -> dict[int, tuple[ContentPart, ...]]:
        p = tables.record_parts
        contents: dict[int, list[ContentPart]] = {}
        with read_transaction(self._engine) as conn:
            for chunk in _chunks(sorted(set(sequences))):
                query = (
                    select(p.c.sequence, p.c.kind, p.c.mime_type, p.c.data)
                    .where(p.c.run_id == run_id, p.c.sequence.in_(chunk))
                    .order_by(p.c.sequence, p.c.part_index)
                )
                for row in conn.execute(query):
                    contents.setdefault(row.sequence, []).append(
                        ContentPart(PartKind(row.kind), bytes(row.data), row.mime_type)
                    )
        return {sequence: tuple(parts) for sequence, parts in contents.items()}

    def resolve_handle(self, handle: str) -> tuple[str, int] | None:
        r = tables.records
        with read_transaction(self._engine) as conn:
            row = conn.execute(
                select(r.c.run_id, r.c.sequence).where(
                    r.c.handle == handle, r.c.kind == RecordKind.TOOL_RESULT.value
                )
            ).first()
        return None if row is None else (row.run_id, row.sequence)

    def turn_start(self, run_id: str) -> int:
        # Every ResolveTurn and AssemblePrompt runs this (the turn pins the surface).
        return self._latest_of_kind(run_id, RecordKind.USER_MESSAGE)

    def latest_assistant_sequence(self, run_id: str) -> int:
        # Every tool call runs this (its request id names the assistant step).
        return self._latest_of_kind(run_id, RecordKind.ASSISTANT_MESSAGE)

    def latest_of_kind_now(self, loop: LoopConnection, run_id: str, kind: RecordKind) -> int | None:
        """`turn_start` (USER_MESSAGE) or `latest_assistant_sequence` (ASSISTANT_MESSAGE) on
        the event loop's connection, or None when not now. A WAL reader does not wait for
        writers, and this one reads one indexed MAX, about as long as the loop's other
        bookkeeping for a call; handing it to a worker thread instead cost a ResolveTurn about
        three times that in thread switches."""
        rows = loop.select_now(self._latest_of_kind_sql, (run_id, kind.value))
        return None if rows is None else _latest(rows)

    def _latest_of_kind(self, run_id: str, kind: RecordKind) -> int:
        return _latest(plain_select(self._engine, self._latest_of_kind_sql, (run_id, kind.value)))


def _latest(rows: list[Any]) -> int:
    ((value,),) = rows
    return int(value or 0)


def _skeletons() -> Select[Any]:
    """A record's columns but its content, in sequence order (the caller adds the WHERE)."""
    r = tables.records
    return select(
        r.c.sequence,
        r.c.kind,
        r.c.handle,
        r.c.call_id,
        r.c.server,
        r.c.tool,
        r.c.is_error,
        r.c.tool_calls,
        r.c.content_bytes,
    ).order_by(r.c.sequence)


def _skeleton_rows(rows: Sequence[Any]) -> list[RecordSkeleton]:
    return [
        RecordSkeleton(
            sequence=row.sequence,
            kind=RecordKind(row.kind),
            handle=row.handle or "",
            call_id=row.call_id,
            server=row.server,
            tool=row.tool,
            is_error=row.is_error,
            tool_calls=tuple(ToolCall(*call) for call in json.loads(row.tool_calls)),
            content_bytes=row.content_bytes,
        )
        for row in rows
    ]

"""Values over a MiB into and out of their rows a MiB per call, per dialect: storage's half of
the latency workarounds in `psych_sidecar.bulk` (this half speaks SQL, so it stays here).

A value bound to a statement, or fetched with its row, is copied in one call while its caller
holds the GIL, and every other thread, the event loop's included, waits that long. A large
part or recorded call result (a tool result of tens of MB) is therefore:

- written: bound empty with its row, then streamed in (`stream_into_row`). SQLite sizes it
  with zeroblob() and takes it through an incremental blob handle; PostgreSQL takes it with a
  binary COPY into a temporary table of the session and moves it into the row itself;
- read back whole (`large_value_columns`, then `large_value`): on SQLite left out of the row
  and read through a blob handle; on PostgreSQL it arrives as bytea hex text, unescaped a
  slice at a time by `bytea_loader.SlicedByteaLoader` (registered on every PostgreSQL
  connection).

Reading a range of one part needs none of this: only the range is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Row,
    case,
    func,
    literal_column,
    null,
    select,
    text,
    update,
)

# Binding 50 MB stalled every other thread for ~25 ms on SQLite, 26-32 ms through psycopg on
# PostgreSQL. Streamed a MiB per call, each call short, the worst pause of a 1 ms ticker beside
# 50 MB writes fell: SQLite ~28 ms -> ~8 ms; PostgreSQL 26-32 ms -> 1.4-4.8 ms, and the write
# ~15 % quicker.
STREAMED_BYTES = 1 << 20
# PostgreSQL's binary COPY format around one row of one bytea field.
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
_COPY_TRAILER = (-1).to_bytes(2, "big", signed=True)
# Where a large value waits on PostgreSQL before the UPDATE that moves it into its row: one
# per session, emptied by that UPDATE's DELETE and, failing that, at commit. The sidecar's role
# needs the TEMPORARY privilege for it (`migrate.check_writable_values`, checked at start).
_INCOMING = "psych_incoming_value"


def streamed_later(data: bytes | None) -> bool:
    """Whether `data` is bound empty now and streamed into its row after (stream_into_row)."""
    return data is not None and len(data) > STREAMED_BYTES


def stream_into_row(
    conn: Connection, column: Column[bytes], where: Sequence[ColumnElement[bool]], data: bytes
) -> None:
    """Writes `data` into `column` of the one row `where` selects, in this transaction, a MiB
    per call. SQLite: sized with zeroblob() (SQLite fills it in, GIL released), then written
    through an incremental blob handle. PostgreSQL: copied (binary COPY) into a temporary
    table of this session, then moved into the row by the server."""
    if conn.dialect.name == "postgresql":
        _copy_into_row(conn, column, where, data)
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
        for start in range(0, len(data), STREAMED_BYTES):
            blob.write(view[start : start + STREAMED_BYTES])


def _copy_into_row(
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
        for start in range(0, len(data), STREAMED_BYTES):
            copy.write(view[start : start + STREAMED_BYTES])
        copy.write(_COPY_TRAILER)
    incoming: ColumnElement[bytes] = literal_column(f"(SELECT value FROM {_INCOMING})")
    conn.execute(update(column.table).where(*where).values({column.name: incoming}))
    conn.execute(text(f"DELETE FROM {_INCOMING}"))


def large_value_columns(conn: Connection, column: Column[bytes]) -> list[ColumnElement[Any]]:
    """The columns that read `column` as `value`. On SQLite a value over a MiB is not read
    with the row: fetching it copied it whole with the GIL held (worst pause ~27 ms for 50 MB;
    1-3.5 ms through the handle). Its row gives its size and rowid instead, and `large_value`
    reads it through a blob handle, a MiB per call. (On PostgreSQL
    `bytea_loader.SlicedByteaLoader` slices it.)"""
    if conn.dialect.name != "sqlite":
        return [column.label("value")]
    size = func.length(column)
    return [
        case((size > STREAMED_BYTES, null()), else_=column).label("value"),
        size.label("size"),
        literal_column(f"{column.table.name}.rowid").label("rowid"),
    ]


def large_value(conn: Connection, column: Column[bytes], row: Row[Any]) -> bytes:
    """The value a row selected with `large_value_columns` holds, read now if it was left out."""
    if row.value is not None:
        return bytes(row.value)
    driver = conn.connection.driver_connection
    assert driver is not None
    table = column.table
    pieces = []
    with driver.blobopen(table.name, column.name, row.rowid, readonly=True) as blob:
        for _ in range(0, row.size, STREAMED_BYTES):
            pieces.append(blob.read(STREAMED_BYTES))
    return b"".join(pieces)

"""How the worker threads run SQL: a SQLAlchemy transaction, one SELECT straight on a pooled
DB-API connection, a write transaction as a DB-API cursor, and a Run's newest rows of a table.
Each maps the driver's "not now" failures to STORAGE_UNAVAILABLE (`failures`). None of them is
for the event loop's thread (a pooled connection may be waited for:
`engines.refuse_the_event_loop`); the loop's own SQLite connection is `loop_connection`."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, Row, Table, select

from psych_sidecar.storage.engines import WRITE_OPTION
from psych_sidecar.storage.failures import unavailable_as_typed_errors
from psych_sidecar.telemetry import metrics, tracing


@contextlib.contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction for reads (`_transaction`)."""
    yield from _transaction(engine, write=False)


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that takes SQLite's write lock up front (PostgreSQL needs no such thing),
    so it never fails to upgrade a read lock halfway (`_transaction`)."""
    yield from _transaction(engine, write=True)


def _transaction(engine: Engine, *, write: bool) -> Iterator[Connection]:
    """Every driver failure that means the database is unavailable (down, restarting, locked
    past the busy timeout, a serialization failure) leaves here as STORAGE_UNAVAILABLE;
    nothing was committed by this transaction unless the failure came after its commit.
    Its wait for a pooled connection is a metric; the transaction is a span when tracing."""
    with tracing.span("db.transaction") as span, unavailable_as_typed_errors():
        if span is not None:
            span.set_attributes(
                {
                    "db.system.name": engine.dialect.name,
                    "psych.write": write,
                    # The repository method that opened it (frames: this body, the read or
                    # write transaction, contextlib's __enter__, the caller), so a slow
                    # transaction is named in the trace.
                    "code.function": sys._getframe(3).f_code.co_qualname,
                }
            )
        started = time.perf_counter()
        with engine.connect() as connection:
            metrics.record_pool_wait(time.perf_counter() - started)
            if write:
                connection = connection.execution_options(**{WRITE_OPTION: True})
            with connection.begin():
                yield connection


def plain_select(engine: Engine, sql: str, parameters: tuple[Any, ...]) -> list[Any]:
    """Rows of one SELECT run straight on a pooled DB-API connection, for the reads every
    ResolveTurn and tool call makes: SQLAlchemy's statement and transaction machinery costs
    several times the query itself there, and one SELECT is atomic on its own on both
    databases. `sql` is the driver's SQL, parameters positional (`statements.py`), the same
    string the loop's connection runs (`LoopConnection.select_now`). The driver's "not now"
    failures leave as STORAGE_UNAVAILABLE, as from a transaction.

    On PostgreSQL the SELECT runs in autocommit: psycopg would otherwise open a transaction
    for it (BEGIN) and the pool end it (ROLLBACK), two more round trips for one read, and
    through PgBouncer two more statements on a server connection. SQLite's connections are
    in autocommit already (`engines.configure_sqlite`)."""
    with unavailable_as_typed_errors():
        dbapi_connection = engine.raw_connection()
        autocommit = engine.dialect.name == "postgresql"
        try:
            if autocommit:
                dbapi_connection.driver_connection.autocommit = True  # type: ignore[union-attr]
            cursor = dbapi_connection.cursor()
            cursor.execute(sql, parameters)
            rows = cursor.fetchall()
            cursor.close()
            if autocommit:
                dbapi_connection.driver_connection.autocommit = False  # type: ignore[union-attr]
        except Exception:
            # A connection that failed under us is not handed to the next caller.
            dbapi_connection.invalidate()
            raise
        finally:
            dbapi_connection.close()
    return list(rows)


@contextlib.contextmanager
def driver_write(engine: Engine) -> Iterator[tuple[Any, Connection]]:
    """A write transaction as a DB-API cursor, for the statements every tool call's append
    runs (SQLAlchemy's statement machinery cost several times what SQLite does for them),
    with the pooled transaction's Connection (for values streamed into their rows)."""
    with write_transaction(engine) as connection:
        pooled = connection.connection.cursor()
        try:
            yield pooled, connection
        finally:
            pooled.close()


def newest_of_run(
    engine: Engine, table: Table, tiebreak: str, run_id: str, limit: int
) -> list[Row[Any]]:
    """A Run's newest `limit` rows of `table` (by create time, then the `tiebreak` column),
    oldest first."""
    query = (
        select(table)
        .where(table.c.run_id == run_id)
        .order_by(table.c.create_time_us.desc(), table.c[tiebreak].desc())
        .limit(limit)
    )
    with read_transaction(engine) as conn:
        rows = conn.execute(query).all()
    return list(reversed(rows))

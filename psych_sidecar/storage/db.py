"""Engines for SQLite (embedded default) and PostgreSQL, and the migration entry point."""

from __future__ import annotations

import contextlib
import fcntl
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.engine import URL

from psych_sidecar.telemetry import metrics, tracing

# Any constant works; it only has to be the same in every sidecar sharing a database.
_MIGRATION_LOCK_KEY = 0x7073_6964_6563_6172  # "psidecar"
_WRITE_OPTION = "psych_write"
_SQLITE_MMAP_BYTES = 2**31


def normalize_url(database_url: str) -> URL:
    """Accept plain postgresql:// URLs and point them at psycopg 3."""
    url = make_url(database_url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.drivername not in ("sqlite", "sqlite+pysqlite", "postgresql+psycopg"):
        raise ValueError(f"unsupported database {url.drivername!r}: use sqlite or postgresql")
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        raise ValueError("SQLite needs a file: sqlite:///relative/path or sqlite:////absolute/path")
    return url


def create_database_engine(database_url: str, pool_size: int) -> Engine:
    url = normalize_url(database_url)
    if url.get_backend_name() == "sqlite":
        assert url.database is not None
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            pool_size=pool_size,
            max_overflow=0,
            connect_args={"check_same_thread": False, "timeout": 30},
        )
        _configure_sqlite(engine)
        return engine
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from pysqlite so writes can BEGIN IMMEDIATE: a deferred
        # transaction that later upgrades to a write lock fails under concurrency instead
        # of waiting.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        # Memory-map the file (up to SQLite's compile-time cap, 2 GiB by default): reading a
        # slice near the end of a long part then follows its overflow-page chain in memory
        # instead of with one read() call per page.
        cursor.execute(f"PRAGMA mmap_size={_SQLITE_MMAP_BYTES}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


@contextlib.contextmanager
def transaction(engine: Engine, *, write: bool) -> Iterator[Connection]:
    """A transaction; `write=True` takes SQLite's write lock up front (PostgreSQL ignores it).
    Its wait for a pooled connection is a metric; the transaction is a span when tracing."""
    attributes: dict[str, str | bool] = {
        "db.system.name": engine.dialect.name,
        "psych.write": write,
    }
    if tracing.tracer() is not None:
        # The repository method that opened it (frames: this body, contextlib's __enter__,
        # the caller), so a slow transaction is named in the trace.
        attributes["code.function"] = sys._getframe(2).f_code.co_qualname
    with tracing.span("db.transaction", attributes):
        started = time.perf_counter()
        with engine.connect() as connection:
            metrics.observe(metrics.DB_POOL_WAIT_SECONDS, time.perf_counter() - started)
            if write:
                connection = connection.execution_options(**{_WRITE_OPTION: True})
            with connection.begin():
                yield connection


def plain_select(engine: Engine, sql: str, parameters: tuple[Any, ...]) -> list[Any]:
    """Rows of one SELECT run straight on a pooled DB-API connection, for the reads every
    ResolveTurn and tool call makes: SQLAlchemy's statement and transaction machinery costs
    several times the query itself there, and one SELECT is atomic on its own on both
    databases. `sql` uses the dialect's placeholder (:func:`placeholder`)."""
    dbapi_connection = engine.raw_connection()
    try:
        cursor = dbapi_connection.cursor()
        cursor.execute(sql, parameters)
        rows = cursor.fetchall()
        cursor.close()
    finally:
        dbapi_connection.close()
    return list(rows)


def placeholder(engine: Engine) -> str:
    """The DB-API parameter marker of the engine's driver (sqlite3: ?, psycopg: %s)."""
    return "?" if engine.dialect.name == "sqlite" else "%s"


def alembic_config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", "psych_sidecar.storage:migrations")
    config.attributes["connection"] = connection
    return config


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest migration. Safe to call from many sidecars at once:
    one runs the migrations while the others wait, then find nothing left to do."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
            connection.commit()
            try:
                command.upgrade(alembic_config(connection), "head")
                connection.commit()
            finally:
                connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": _MIGRATION_LOCK_KEY}
                )
                connection.commit()
        return
    database = engine.url.database
    assert database is not None
    with open(f"{database}.migrate-lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            with engine.connect() as connection:
                command.upgrade(alembic_config(connection), "head")
                connection.commit()
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()

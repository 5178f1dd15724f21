"""Engines for SQLite (embedded default) and PostgreSQL: URLs, pools, the per-connection
settings (pragmas, loaders), and the guard that keeps pooled connections off the event loop."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Connection, Engine, create_engine, event, exc, make_url
from sqlalchemy.engine import URL

SQLITE_MMAP_BYTES = 2**31
DEFAULT_BUSY_TIMEOUT_SECONDS = 5.0
# The execution option that makes a SQLite transaction BEGIN IMMEDIATE (`transactions`).
WRITE_OPTION = "psych_write"
# A pooled PostgreSQL connection idle longer than this is pinged before use
# (`ping_connections_idle_for`).
PING_AFTER_IDLE_SECONDS = 1.0
# Where a pooled connection's info keeps when it was last returned to the pool.
_RETURNED_AT = "psych_returned_at"
# How the sidecar's PostgreSQL connections reach the server (storage.database_pooling):
# "session", each is a server session of its own (direct, or PgBouncer in session mode);
# "transaction", a pooler such as PgBouncer in transaction mode hands each transaction to any
# server connection, so nothing may outlive a transaction on one (docs/operations.md).
Pooling = Literal["session", "transaction"]


class PooledConnectionOnTheEventLoop(RuntimeError):
    """A pooled connection was asked for on a thread running an event loop: storage work that
    could wait (for the pool, a lock, the network) ran where it stalls every RPC. Such work
    goes to the storage threads; the loop's own SQLite reads and small appends go through
    `storage.now` (which never waits)."""


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


def create_database_engine(
    database_url: str,
    *,
    pool_size: int,
    busy_timeout_seconds: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
    pooling: Pooling = "session",
    ping_after_idle_seconds: float = PING_AFTER_IDLE_SECONDS,
) -> Engine:
    """An engine whose waits are bounded by `busy_timeout_seconds`: a SQLite writer waiting
    for the lock, a PostgreSQL statement waiting for a row lock, a connection attempt and a
    wait for a pooled connection each give up after about that long (STORAGE_UNAVAILABLE).

    With `pooling` "transaction" (PostgreSQL behind PgBouncer in transaction mode) nothing is
    left on a server session: psycopg prepares no statement on the server (it would after five
    runs of one query, and the next transaction may land on a server connection that lacks it
    or already has it), and the lock timeout, which PgBouncer would refuse as a startup
    parameter, is set inside each transaction (SET LOCAL: one more round trip per
    transaction).

    A pooled PostgreSQL connection idle for longer than `ping_after_idle_seconds` is pinged
    before use (`ping_connections_idle_for`)."""
    url = normalize_url(database_url)
    if url.get_backend_name() == "sqlite":
        assert url.database is not None
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            pool_size=pool_size,
            max_overflow=0,
            pool_timeout=busy_timeout_seconds,
            connect_args={"check_same_thread": False, "timeout": busy_timeout_seconds},
        )
        configure_sqlite(engine, busy_timeout_seconds)
        refuse_the_event_loop(engine)
        return engine
    lock_ms = max(1, int(busy_timeout_seconds * 1000))
    connect_args: dict[str, Any] = {"connect_timeout": max(1, math.ceil(busy_timeout_seconds))}
    if pooling == "transaction":
        connect_args["prepare_threshold"] = None
    else:
        connect_args["options"] = f"-c lock_timeout={lock_ms}"
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=busy_timeout_seconds,
        connect_args=connect_args,
    )
    configure_postgresql(engine)
    ping_connections_idle_for(engine, ping_after_idle_seconds)
    if pooling == "transaction":
        time_out_locks_per_transaction(engine, lock_ms)
    refuse_the_event_loop(engine)
    return engine


def configure_postgresql(engine: Engine) -> None:
    from psych_sidecar.storage.bytea_loader import SlicedByteaLoader

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.adapters.register_loader("bytea", SlicedByteaLoader)


def ping_connections_idle_for(engine: Engine, seconds: float) -> None:
    """Check that a pooled connection is alive before it is used, when it sat in the pool for
    longer than `seconds` (where a server restart, an idle timeout or a middlebox may have
    ended it): a dead one is replaced, and with it every connection pooled before, as
    SQLAlchemy's `pool_pre_ping` does. That pings at every checkout: one more round trip per
    transaction and per plain SELECT, through PgBouncer one more query handed to a server
    connection. A connection in use within the last `seconds` is used as it is; if it died
    meanwhile, its call fails as STORAGE_UNAVAILABLE, as a transaction in flight at that
    moment would have, and the failure discards it."""

    @event.listens_for(engine, "checkin")
    def on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info[_RETURNED_AT] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        returned_at = record.info.get(_RETURNED_AT)
        if returned_at is None or time.monotonic() - returned_at <= seconds:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            raise exc.InvalidatePoolError(str(error)) from error


def time_out_locks_per_transaction(engine: Engine, lock_ms: int) -> None:
    """Bound every lock wait of a transaction to `lock_ms` with a setting that ends with it."""

    @event.listens_for(engine, "begin")
    def on_begin(connection: Connection) -> None:
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = {int(lock_ms)}")


def configure_sqlite(engine: Engine, busy_timeout_seconds: float, read_only: bool = False) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from pysqlite so writes can BEGIN IMMEDIATE: a deferred
        # transaction that later upgrades to a write lock fails under concurrency instead
        # of waiting.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if read_only:
            # Refuse any write in SQL too (the file is opened read-only already).
            cursor.execute("PRAGMA query_only=ON")
        else:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={max(0, int(busy_timeout_seconds * 1000))}")
        cursor.execute("PRAGMA foreign_keys=ON")
        # Memory-map the file (up to SQLite's compile-time cap, 2 GiB by default): reading a
        # slice near the end of a long part then follows its overflow-page chain in memory
        # instead of with one read() call per page.
        cursor.execute(f"PRAGMA mmap_size={SQLITE_MMAP_BYTES}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def refuse_the_event_loop(engine: Engine) -> None:
    """Make every checkout of a pooled connection on a thread running an event loop fail with
    PooledConnectionOnTheEventLoop: any storage call that forgot to leave the loop fails
    loudly, in every test that makes it. A C-level look-up and an event dispatch per
    checkout: a plain SELECT on SQLite took 47.9 µs with it and 47.3 µs without (medians of
    six alternating rounds of 20,000; the rounds varied by more than that). Only engines that
    serve RPCs carry it: a one-shot reader (``inspect --database-url``) runs its reads inline
    on purpose."""

    @event.listens_for(engine, "checkout")
    def on_checkout(_dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if asyncio._get_running_loop() is not None:
            raise PooledConnectionOnTheEventLoop(
                "a pooled database connection was checked out on the event loop's thread"
            )


def erase_freed_content(connection: Connection) -> None:
    """On SQLite, make this connection zero what its writes delete or replace (``PRAGMA
    secure_delete``), so an old value is not left readable in the file's free space; used where
    secrets are rewritten. PostgreSQL keeps old row versions until VACUUM (docs/security.md)."""
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql("PRAGMA secure_delete=ON")


def settle_freed_content(engine: Engine) -> None:
    """On SQLite, copy the write-ahead log into the database file and empty it (a TRUNCATE
    checkpoint), so the pages as they were before a rewrite of secrets are gone from the log."""
    if engine.dialect.name != "sqlite":
        return
    # On the DB-API connection, outside any transaction: a checkpoint cannot pass an open one.
    dbapi_connection = engine.raw_connection()
    try:
        dbapi_connection.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        dbapi_connection.close()

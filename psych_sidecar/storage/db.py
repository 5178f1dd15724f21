"""Engines for SQLite (embedded default) and PostgreSQL, and the migration entry point."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import sqlite3
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, make_url, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL

from psych_sidecar.domain.errors import SidecarError, storage_unavailable
from psych_sidecar.domain.runlog import (
    NotForTheEventLoop,
    attempted_on_the_event_loop,
    worker_thread_only,
)
from psych_sidecar.secrets.cipher import KeyRing
from psych_sidecar.telemetry import metrics, tracing

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same in every sidecar sharing a database.
_MIGRATION_LOCK_KEY = 0x7073_6964_6563_6172  # "psidecar"
# The revision the newest migration makes (storage/migrations/versions; a test holds it to
# alembic's head). Known without alembic, so a start on a current schema never imports it.
SCHEMA_HEAD = "oauth_refresh_claims"
_WRITE_OPTION = "psych_write"
SQLITE_MMAP_BYTES = 2**31
DEFAULT_BUSY_TIMEOUT_SECONDS = 5.0
# SQLite result codes (primary, before the extended part) that mean "not now", not "wrong":
# another writer holds the lock, the file cannot be opened or written at the moment.
_SQLITE_TRANSIENT = (
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_IOERR",
    "SQLITE_CANTOPEN",
    "SQLITE_FULL",
    "SQLITE_PROTOCOL",
    "SQLITE_READONLY",
)


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
    pool_size: int,
    busy_timeout_seconds: float = DEFAULT_BUSY_TIMEOUT_SECONDS,
) -> Engine:
    """An engine whose waits are bounded by `busy_timeout_seconds`: a SQLite writer waiting
    for the lock, a PostgreSQL statement waiting for a row lock, a connection attempt and a
    wait for a pooled connection each give up after about that long (STORAGE_UNAVAILABLE)."""
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
        _configure_sqlite(engine, busy_timeout_seconds)
        return engine
    lock_ms = max(1, int(busy_timeout_seconds * 1000))
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_timeout=busy_timeout_seconds,
        connect_args={
            "connect_timeout": max(1, math.ceil(busy_timeout_seconds)),
            "options": f"-c lock_timeout={lock_ms}",
        },
    )
    _configure_postgresql(engine)
    return engine


class DatabaseRefused(Exception):
    """A database a read-only reader will not use: no such SQLite file, or a schema this code
    does not know. The message says which, in one line."""


def open_read_only(
    database_url: str, busy_timeout_seconds: float = DEFAULT_BUSY_TIMEOUT_SECONDS
) -> Engine:
    """An engine that cannot write, for `psych-sidecar inspect --database-url`: a SQLite file
    opened with ``mode=ro`` (and ``query_only``), a PostgreSQL session whose transactions are
    all READ ONLY (``default_transaction_read_only``). It never creates a file and never
    migrates: a missing SQLite file, or a schema revision other than the one this code's
    migrations end at, raises :class:`DatabaseRefused`.

    SQLite, like for any reader of a WAL database, may create the empty ``-wal`` and ``-shm``
    files beside it when no sidecar has it open; the database file itself is never written."""
    url = normalize_url(database_url)
    timeout_ms = max(1, int(busy_timeout_seconds * 1000))
    if url.get_backend_name() == "sqlite":
        assert url.database is not None
        path = Path(url.database).resolve()
        if not path.is_file():
            raise DatabaseRefused(f"no SQLite database at {path} (it is not created)")
        uri = sqlite_read_only_uri(path)

        def connect() -> sqlite3.Connection:
            return sqlite3.connect(
                uri, uri=True, check_same_thread=False, timeout=busy_timeout_seconds
            )

        engine = create_engine(url, creator=connect, pool_size=1, max_overflow=0)
        _configure_sqlite(engine, busy_timeout_seconds, read_only=True)
    else:
        engine = create_engine(
            url,
            pool_size=1,
            max_overflow=0,
            connect_args={
                "connect_timeout": max(1, math.ceil(busy_timeout_seconds)),
                "options": f"-c default_transaction_read_only=on -c lock_timeout={timeout_ms}",
            },
        )
        _configure_postgresql(engine)
    try:
        check_revision(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def sqlite_read_only_uri(database: str | Path) -> str:
    """The URI that opens a SQLite file read-only (``mode=ro``): it never creates the file."""
    return f"file:{urllib.parse.quote(str(Path(database).resolve()))}?mode=ro"


def _migration_scripts() -> ScriptDirectory:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", "psych_sidecar.storage:migrations")
    return ScriptDirectory.from_config(config)


def expected_revision() -> str:
    """The revision this code's migrations end at."""
    return SCHEMA_HEAD


def migrations_head() -> str | None:
    """The head of the migration scripts, as alembic reads them (what SCHEMA_HEAD must be)."""
    return _migration_scripts().get_current_head()


def schema_name(revision: str | None) -> str:
    """What an operator is shown for a schema revision: the name of the migration file that
    made it (the early revision ids predate the files' descriptive names and mean nothing to
    an operator); a revision this code does not know is shown as stored."""
    if revision is None:
        return "none"
    from alembic.util import CommandError

    try:
        script = _migration_scripts().get_revision(revision)
    except CommandError:  # no such revision
        script = None
    return Path(script.path).stem if script is not None else revision


def check_revision(engine: Engine) -> None:
    """Raise :class:`DatabaseRefused` unless the database's schema is at this code's revision
    (read from alembic_version; nothing is created or migrated)."""
    expected = expected_revision()
    found = current_revision(engine)
    if found != expected:
        where = engine.url.render_as_string(hide_password=True)
        if found is None:
            raise DatabaseRefused(
                f"{where} has no psych-sidecar schema (no alembic_version revision); "
                "run `psych-sidecar migrate` on it first"
            )
        raise DatabaseRefused(
            f"{where} is at schema {schema_name(found)!r}, "
            f"this psych-sidecar knows {schema_name(expected)!r}: "
            "use the psych-sidecar version that runs on it"
        )


def check_writable_values(engine: Engine) -> None:
    """Raise :class:`DatabaseRefused` when the sidecar could not store a large value: on
    PostgreSQL, values over 1 MiB are written through a temporary table (storage/bulk_values.py)
    and need the TEMPORARY privilege on the database (PostgreSQL grants it to every role unless
    it was revoked). Found at start, not by the first large tool result."""
    if engine.dialect.name != "postgresql":
        return
    with engine.connect() as connection:
        allowed = connection.execute(
            text("SELECT has_database_privilege(current_database(), 'TEMPORARY')")
        ).scalar_one()
    if not allowed:
        where = engine.url.render_as_string(hide_password=True)
        raise DatabaseRefused(
            f"the PostgreSQL role of {where} may not create temporary tables there (the "
            "TEMPORARY privilege), which storing values over 1 MiB needs: GRANT TEMPORARY ON "
            "DATABASE to it"
        )


def _configure_postgresql(engine: Engine) -> None:
    from psych_sidecar.storage.bytea_loader import SlicedByteaLoader

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.adapters.register_loader("bytea", SlicedByteaLoader)


def _configure_sqlite(engine: Engine, busy_timeout_seconds: float, read_only: bool = False) -> None:
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
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def unavailable_error(error: BaseException) -> SidecarError | None:
    """The typed error for a driver failure that means "the database cannot be used just
    now", or None for one that means a bug (bad SQL, a missing table, a constraint).

    The one place that reads SQLAlchemy's, psycopg's and sqlite3's exceptions, as httpx's
    map_httpcore_exceptions does for its transport."""
    if isinstance(error, sa_exc.TimeoutError | sa_exc.DisconnectionError):
        # No pooled connection came free in time, or the connection was lost.
        return storage_unavailable(_short(error))
    if isinstance(error, sqlite3.OperationalError):
        # Raised bare by code that uses the driver directly (raw_connection).
        name = getattr(error, "sqlite_errorname", "") or ""
        return storage_unavailable(_short(error)) if name.startswith(_SQLITE_TRANSIENT) else None
    if isinstance(error, _psycopg_unavailable()):
        return storage_unavailable(_short(error))
    if not isinstance(error, sa_exc.DBAPIError):
        return None
    original = error.orig
    if error.connection_invalidated or isinstance(error, sa_exc.InterfaceError):
        return storage_unavailable(_short(original or error))
    if not isinstance(error, sa_exc.OperationalError):
        return None
    if isinstance(original, sqlite3.Error):
        name = getattr(original, "sqlite_errorname", "") or ""
        if not name.startswith(_SQLITE_TRANSIENT):
            return None
    # psycopg: every OperationalError is a connection, resource, operator-intervention,
    # lock-timeout or serialization failure (SQLSTATE classes 08, 40, 53, 55P03, 57, 58).
    return storage_unavailable(_short(original or error))


def _short(error: BaseException) -> str:
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return first_line[:200]


def _psycopg_unavailable() -> tuple[type[Exception], ...]:
    """psycopg's errors raised bare for a lost or refused connection. psycopg is imported with
    a PostgreSQL engine only (not on SQLite): before that, nothing can raise them."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None:
        return ()
    return (psycopg.OperationalError, psycopg.InterfaceError)


@contextlib.contextmanager
def unavailable_as_typed_errors() -> Iterator[None]:
    """Driver failures inside the block that mean "the database cannot be used just now" leave
    as STORAGE_UNAVAILABLE (see `unavailable_error`); others pass through unchanged."""
    try:
        yield
    except Exception as error:
        mapped = unavailable_error(error)
        if mapped is None:
            raise
        log.warning("database unavailable: %s", mapped.metadata["detail"])
        raise mapped from error


# The read transaction this thread's reads share while a `shared_reads` block is open.
_shared = threading.local()


@contextlib.contextmanager
def shared_reads(engine: Engine) -> Iterator[None]:
    """Until the block ends, this thread's reads on `engine` (transactions and `plain_select`)
    are one transaction: a hop that reads several things (a tool call's turn, then its
    recorded answer) pays for one pooled connection, one BEGIN and one COMMIT instead of one
    each, and its reads see one snapshot on SQLite. Writes inside the block still get
    transactions of their own."""
    if getattr(_shared, "engine", None) is not None:
        yield
        return
    no_wait = _bound_no_wait(engine)
    if no_wait is not None:
        with no_wait.transaction(write=False):
            yield
        return
    with transaction(engine, write=False) as connection:
        _shared.engine, _shared.connection = engine, connection
        try:
            yield
        finally:
            _shared.engine = _shared.connection = None


@contextlib.contextmanager
def transaction(engine: Engine, *, write: bool) -> Iterator[Connection]:
    """A transaction; `write=True` takes SQLite's write lock up front (PostgreSQL ignores it).

    Every driver failure that means the database is unavailable (down, restarting, locked
    past the busy timeout, a serialization failure) leaves here as STORAGE_UNAVAILABLE;
    nothing was committed by this transaction unless the failure came after its commit.
    Its wait for a pooled connection is a metric; the transaction is a span when tracing.
    A read inside a `shared_reads` block of the same engine joins that block's transaction.
    Inside a `NoWaitSqlite.bound` block it refuses (NotForTheEventLoop): SQLAlchemy's
    transactions are the worker threads' path."""
    if _bound_no_wait(engine) is not None:
        worker_thread_only("a SQLAlchemy transaction")
    if not write and getattr(_shared, "engine", None) is engine:
        with unavailable_as_typed_errors():
            yield _shared.connection
        return
    with tracing.span("db.transaction") as span, unavailable_as_typed_errors():
        if span is not None:
            span.set_attributes(
                {
                    "db.system.name": engine.dialect.name,
                    "psych.write": write,
                    # The repository method that opened it (frames: this body, contextlib's
                    # __enter__, the caller), so a slow transaction is named in the trace.
                    "code.function": sys._getframe(2).f_code.co_qualname,
                }
            )
        started = time.perf_counter()
        with engine.connect() as connection:
            metrics.record_pool_wait(time.perf_counter() - started)
            if write:
                connection = connection.execution_options(**{_WRITE_OPTION: True})
            with connection.begin():
                yield connection


def plain_select(engine: Engine, sql: str, parameters: tuple[Any, ...]) -> list[Any]:
    """Rows of one SELECT run straight on a pooled DB-API connection, for the reads every
    ResolveTurn and tool call makes: SQLAlchemy's statement and transaction machinery costs
    several times the query itself there, and one SELECT is atomic on its own on both
    databases. `sql` uses the dialect's placeholder (:func:`placeholder`). The driver's
    "not now" failures leave as STORAGE_UNAVAILABLE, as from `transaction`. Inside a
    `shared_reads` block of the same engine it runs in that block's transaction; inside a
    `NoWaitSqlite.bound` block, on that connection."""
    no_wait = _bound_no_wait(engine)
    if no_wait is not None:
        return no_wait.select(sql, parameters)
    if getattr(_shared, "engine", None) is engine:
        with unavailable_as_typed_errors():
            cursor = _shared.connection.connection.cursor()
            try:
                cursor.execute(sql, parameters)
                return list(cursor.fetchall())
            finally:
                cursor.close()
    with unavailable_as_typed_errors():
        dbapi_connection = engine.raw_connection()
        try:
            cursor = dbapi_connection.cursor()
            cursor.execute(sql, parameters)
            rows = cursor.fetchall()
            cursor.close()
        except Exception:
            # A connection that failed under us is not handed to the next caller.
            dbapi_connection.invalidate()
            raise
        finally:
            dbapi_connection.close()
    return list(rows)


@contextlib.contextmanager
def driver_write(engine: Engine) -> Iterator[tuple[Any, Connection | None]]:
    """A write transaction as a DB-API cursor, for the statements every tool call's append
    runs (SQLAlchemy's statement machinery cost several times what SQLite does for them):
    on the event loop's `NoWaitSqlite` connection inside its `bound` block (no SQLAlchemy
    connection then: what needs one is refused there), else in a pooled transaction, whose
    Connection comes with it (for values streamed into their rows)."""
    no_wait = _bound_no_wait(engine)
    if no_wait is not None:
        with no_wait.transaction(write=True) as cursor:
            yield cursor, None
        return
    with transaction(engine, write=True) as connection:
        pooled = connection.connection.cursor()
        try:
            yield pooled, connection
        finally:
            pooled.close()


# The NoWaitSqlite bound to this thread (the event loop's) during an attempt.
_no_wait = threading.local()


def _bound_no_wait(engine: Engine) -> NoWaitSqlite | None:
    bound: NoWaitSqlite | None = getattr(_no_wait, "bound", None)
    return bound if bound is not None and bound.engine is engine else None


class NoWaitSqlite:
    """One read-write connection to a SQLite file for the event loop's thread, on which a tool
    call's reads and its append are attempted before a worker thread is asked (see
    `domain.runlog.loop_attempts`). It never waits: busy timeout 0, and a lock held elsewhere, the
    connection in use, or any failure of SQLite (whose typed answer the worker path gives)
    ends the attempt with NotForTheEventLoop, its transaction rolled back. It never
    checkpoints on the loop either (a checkpoint syncs the file): every `CHECKPOINT_EVERY`
    commits, a write-ahead log past `CHECKPOINT_WAL_BYTES` is checkpointed by `background`.

    Not for PostgreSQL, whose every statement is a network round trip."""

    CHECKPOINT_EVERY = 64
    CHECKPOINT_WAL_BYTES = 4 << 20

    def __init__(self, engine: Engine, background: Callable[[Callable[[], None]], object]) -> None:
        if engine.dialect.name != "sqlite" or not engine.url.database:
            raise ValueError("a SQLite file's engine is needed")
        self.engine = engine
        self._path = Path(engine.url.database)
        self._background = background
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._commits = 0

    @contextlib.contextmanager
    def bound(self) -> Iterator[None]:
        """This thread's storage work on the engine inside the block runs on this connection
        (`plain_select`, `shared_reads`, `driver_write`) or refuses (`transaction`)."""
        if not self._lock.acquire(blocking=False):
            raise NotForTheEventLoop("the connection is in use")
        try:
            self._opened()
            _no_wait.bound = self
            with attempted_on_the_event_loop():
                yield
        finally:
            _no_wait.bound = None
            self._lock.release()

    def select_now(self, sql: str, parameters: tuple[Any, ...]) -> list[Any] | None:
        """One SELECT on this connection outside any attempt (ResolveTurn's turn start, the
        hottest read there is: no binding, no generator), or None where an attempt would
        end (the connection in use or closed, SQLite would wait, anything failed)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._opened().execute(sql, parameters).fetchall()
        except (sqlite3.Error, NotForTheEventLoop):
            return None
        finally:
            self._lock.release()

    def select(self, sql: str, parameters: tuple[Any, ...]) -> list[Any]:
        assert self._connection is not None
        try:
            return self._connection.execute(sql, parameters).fetchall()
        except sqlite3.Error as error:
            raise NotForTheEventLoop(str(error)) from error

    @contextlib.contextmanager
    def transaction(self, *, write: bool) -> Iterator[sqlite3.Cursor]:
        connection = self._connection
        assert connection is not None
        try:
            cursor = connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as error:
            raise NotForTheEventLoop(str(error)) from error
        try:
            yield cursor
            connection.execute("COMMIT")
        except BaseException as error:
            if connection.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    connection.execute("ROLLBACK")
            if isinstance(error, sqlite3.Error):
                raise NotForTheEventLoop(str(error)) from error
            raise
        finally:
            cursor.close()
        if write:
            self._after_commit()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _after_commit(self) -> None:
        self._commits += 1
        if self._commits % self.CHECKPOINT_EVERY:
            return
        try:
            wal_bytes = self._path.with_name(self._path.name + "-wal").stat().st_size
        except OSError:
            return
        if wal_bytes > self.CHECKPOINT_WAL_BYTES:
            # After the commit: a pool already shut down (the sidecar stopping) only skips it.
            with contextlib.suppress(RuntimeError):
                self._background(self._checkpoint)

    def _checkpoint(self) -> None:
        try:
            with self.engine.connect() as connection:
                connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except Exception as error:
            # Nothing is lost (the log keeps every commit, and the next one past the size
            # tries again), but a log that is never checkpointed grows without end: said.
            if not self._closed:
                log.warning("checkpointing the SQLite write-ahead log failed: %s", error)

    def _opened(self) -> sqlite3.Connection:
        """The connection (the lock held), opened on first use; NotForTheEventLoop once closed
        or when SQLite will not open it."""
        if self._closed:
            raise NotForTheEventLoop("closed")
        if self._connection is None:
            try:
                self._connection = self._connect()
            except sqlite3.Error as error:
                raise NotForTheEventLoop(str(error)) from error
        return self._connection

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            str(self._path), timeout=0, isolation_level=None, check_same_thread=False
        )
        for pragma in (
            "synchronous=NORMAL",
            "foreign_keys=ON",
            f"mmap_size={SQLITE_MMAP_BYTES}",
            # Checkpoints are `_checkpoint`'s, on a worker.
            "wal_autocheckpoint=0",
        ):
            connection.execute(f"PRAGMA {pragma}")
        return connection


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


def placeholder(engine: Engine) -> str:
    """The DB-API parameter marker of the engine's driver (sqlite3: ?, psycopg: %s)."""
    return "?" if engine.dialect.name == "sqlite" else "%s"


def alembic_config(connection: Connection, keys: KeyRing | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", "psych_sidecar.storage:migrations")
    config.attributes["connection"] = connection
    # The migration that seals stored secrets needs them (when there is plaintext to seal).
    config.attributes["secret_keys"] = keys
    return config


def migrate(engine: Engine, keys: KeyRing | None = None) -> None:
    """Bring the schema to the newest migration. Safe to call from many sidecars at once:
    one runs the migrations while the others wait, then find nothing left to do. `keys` seal
    secrets stored in plaintext by an older version (a database with none needs no keys).

    A schema already at SCHEMA_HEAD is read with one plain query, and alembic (a tenth of a
    start's imports) is imported only when there is a migration to apply."""
    if current_revision(engine) == SCHEMA_HEAD:
        return
    from alembic import command

    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
            connection.commit()
            try:
                command.upgrade(alembic_config(connection, keys), "head")
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
                command.upgrade(alembic_config(connection, keys), "head")
                connection.commit()
            # A migration that rewrote secrets left the old pages in the write-ahead log.
            settle_freed_content(engine)
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def current_revision(engine: Engine) -> str | None:
    """The schema revision alembic recorded (its alembic_version table), or None for a
    database it never migrated."""
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        revisions = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    if len(revisions) > 1:
        raise DatabaseRefused(
            f"several schema revisions recorded: {sorted(r[0] for r in revisions)}"
        )
    return revisions[0][0] if revisions else None

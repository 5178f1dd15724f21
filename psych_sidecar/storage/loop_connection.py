"""The event loop's own SQLite connection: statements that either run at once or do not run.

A tool call's reads and its small append, and ResolveTurn's turn-start read, take less time on
a SQLite database that need not wait than handing them to a storage thread and back (a thread
wake-up each way, on a small machine often a wait for a core). `LoopConnection` runs them on
the loop's thread and never waits: busy timeout 0, and a lock held elsewhere, the connection in
use, or any failure of SQLite gives None ("not now"), any transaction rolled back; the caller
then asks the storage threads, whose answer (and typed errors) is the real one. The domain
sees it only through `storage.now.SqliteNow` (the `StorageNow` port). Not for PostgreSQL,
whose every statement is a network round trip."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine

from psych_sidecar.storage.engines import SQLITE_MMAP_BYTES

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopConnection:
    """One read-write connection to a SQLite file, for the event loop's thread. It never
    checkpoints on the loop either (a checkpoint syncs the file): every `checkpoint_every`
    commits, a write-ahead log past `checkpoint_wal_bytes` is checkpointed by `background`
    (a storage thread)."""

    def __init__(
        self,
        engine: Engine,
        *,
        background: Callable[[Callable[[], None]], object],
        checkpoint_every: int = 64,
        checkpoint_wal_bytes: int = 4 << 20,
    ) -> None:
        if engine.dialect.name != "sqlite" or not engine.url.database:
            raise ValueError("a SQLite file's engine is needed")
        self.engine = engine
        self._path = Path(engine.url.database)
        self._background = background
        self._checkpoint_every = checkpoint_every
        self._checkpoint_wal_bytes = checkpoint_wal_bytes
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._commits = 0

    def select_now(self, sql: str, parameters: tuple[Any, ...]) -> list[Any] | None:
        """The rows of one SELECT (`sql` with ? markers, the string the storage threads run
        through `transactions.plain_select`), or None when not now. fetchall steps the
        statement to its end, so no read transaction stays open and the next call sees every
        commit made since."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            connection = self._opened()
            return None if connection is None else connection.execute(sql, parameters).fetchall()
        except sqlite3.Error:
            return None
        finally:
            self._lock.release()

    def write_now(self, statements: Callable[[sqlite3.Cursor], T]) -> T | None:
        """`statements` run on a cursor in one write transaction (BEGIN IMMEDIATE) and
        committed: their value; or None when not now (the write lock held elsewhere, any
        failure of SQLite), nothing written. An exception of their own (a typed answer such as
        RUN_NOT_FOUND) leaves as it is, after the rollback."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            connection = self._opened()
            if connection is None:
                return None
            try:
                cursor = connection.execute("BEGIN IMMEDIATE")
            except sqlite3.Error:
                return None
            try:
                value = statements(cursor)
                connection.execute("COMMIT")
            except BaseException as error:
                if connection.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        connection.execute("ROLLBACK")
                if isinstance(error, sqlite3.Error):
                    return None
                raise
            finally:
                cursor.close()
            self._after_commit()
            return value
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _after_commit(self) -> None:
        self._commits += 1
        if self._commits % self._checkpoint_every:
            return
        try:
            wal_bytes = self._path.with_name(self._path.name + "-wal").stat().st_size
        except OSError:
            return
        if wal_bytes > self._checkpoint_wal_bytes:
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

    def _opened(self) -> sqlite3.Connection | None:
        """The connection (the lock held), opened on first use; None once closed or when
        SQLite will not open it."""
        if self._closed:
            return None
        if self._connection is None:
            try:
                self._connection = self._connect()
            except sqlite3.Error:
                return None
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

"""Opening a database read-only, for `psych-sidecar inspect --database-url`: nothing is
written, created or migrated."""

from __future__ import annotations

import math
import sqlite3
import urllib.parse
from pathlib import Path

from sqlalchemy import Engine, create_engine

from psych_sidecar.storage.engines import (
    DEFAULT_BUSY_TIMEOUT_SECONDS,
    configure_postgresql,
    configure_sqlite,
    normalize_url,
)
from psych_sidecar.storage.migrate import DatabaseRefused, check_revision


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
        configure_sqlite(engine, busy_timeout_seconds, read_only=True)
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
        configure_postgresql(engine)
    try:
        check_revision(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def sqlite_read_only_uri(database: str | Path) -> str:
    """The URI that opens a SQLite file read-only (``mode=ro``): it never creates the file."""
    return f"file:{urllib.parse.quote(str(Path(database).resolve()))}?mode=ro"

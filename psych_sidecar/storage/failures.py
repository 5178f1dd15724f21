"""The one boundary that reads driver failures: SQLAlchemy's, psycopg's and sqlite3's errors
that mean "the database cannot be used just now" become STORAGE_UNAVAILABLE; the others (a
bug: bad SQL, a missing table, a constraint) pass through unchanged."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import sys
from collections.abc import Iterator

from sqlalchemy import exc as sa_exc

from psych_sidecar.domain.errors import StorageUnavailable, storage_unavailable

log = logging.getLogger(__name__)

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


def unavailable_error(error: BaseException) -> StorageUnavailable | None:
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
        log.warning("database unavailable: %s", mapped.detail)
        raise mapped from error

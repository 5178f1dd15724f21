"""The databases the tests run on: SQLite files and throwaway PostgreSQL databases."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from sqlalchemy import create_engine, text

from psych_sidecar.secrets.cipher import KeyRing

POSTGRES_URL_ENV = "PSYCH_TEST_POSTGRES_URL"
# The same cluster through a PgBouncer in transaction mode (scripts/with-pgbouncer, which
# scripts/with-postgres runs its command under when pgbouncer is installed).
PGBOUNCER_URL_ENV = "PSYCH_TEST_PGBOUNCER_URL"
# The databases a module whose storage work must also hold through PgBouncer runs on (the
# sidecar is then set with database_pooling=transaction: `pooling_of`).
WITH_PGBOUNCER = ["sqlite", "postgresql", "pgbouncer"]

# The key sealing stored secrets in the tests' sidecars (PostgreSQL refuses to start without
# one; on SQLite a test that wants the key file made beside the database leaves it unset).
TEST_SECRET_KEY = "dGVzdC1vbmx5LXNlY3JldC1rZXktMzItYnl0ZXMtISE="


def keys_of_the_tests() -> KeyRing:
    """The key ring of TEST_SECRET_KEY, for a test that stores connections itself."""
    return KeyRing([base64.b64decode(TEST_SECRET_KEY)])


# The newest migration: what a migrated database reports.
HEAD_REVISION = "tool_input_rounds"


def postgres_admin_url() -> str:
    url = os.environ.get(POSTGRES_URL_ENV)
    if not url:
        pytest.fail(
            f"{POSTGRES_URL_ENV} is not set: run the tests with scripts/test, which starts a "
            "throwaway PostgreSQL (scripts/with-postgres)"
        )
    return url


def pgbouncer_url() -> str:
    url = os.environ.get(PGBOUNCER_URL_ENV)
    if not url:
        pytest.fail(
            f"{PGBOUNCER_URL_ENV} is not set: run the tests with scripts/test, whose "
            "scripts/with-postgres starts a throwaway PgBouncer when pgbouncer is installed "
            "(apt-get install pgbouncer)"
        )
    return url


def pooling_of(database_url: str) -> Literal["session", "transaction"]:
    """The storage.database_pooling a sidecar on `database_url` is set with: transaction
    through the tests' PgBouncer, else session."""
    bouncer = os.environ.get(PGBOUNCER_URL_ENV)
    if bouncer and database_url.startswith(bouncer.rpartition("/")[0] + "/"):
        return "transaction"
    return "session"


@contextlib.contextmanager
def database_of_kind(kind: str, tmp_path: Path) -> Iterator[str]:
    """A fresh database of a parametrized kind: "sqlite" (a file in `tmp_path`), "postgresql"
    or "pgbouncer" (a new PostgreSQL database, the latter reached through PgBouncer)."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'sidecar.db'}"
    elif kind == "pgbouncer":
        with postgres_database(reached_at=pgbouncer_url()) as url:
            yield url
    else:
        with postgres_database() as url:
            yield url


@contextlib.contextmanager
def postgres_database(*, reached_at: str = "") -> Iterator[str]:
    """A new, empty database on the test PostgreSQL server, dropped afterwards; its URL is
    `reached_at`'s (a pooler's in front of the same server) with the database replaced, when
    given."""
    admin_url = postgres_admin_url()
    name = "t_" + uuid.uuid4().hex[:12]
    # pre-ping: a test may restart the server (test_storage_faults) under a pooled connection.
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    base, _, _ = (reached_at or admin_url).rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


def raw_database_bytes(database_url: str) -> bytes:
    """Everything of the database on disk as an attacker holding the file would read it: the
    SQLite file and its write-ahead log, or PostgreSQL's pg_dump output."""
    if database_url.startswith("sqlite"):
        path = Path(database_url.removeprefix("sqlite:///"))
        files = [path, path.with_name(path.name + "-wal")]
        return b"".join(f.read_bytes() for f in files if f.exists())
    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
    return subprocess.run(["pg_dump", dsn], capture_output=True, check=True).stdout

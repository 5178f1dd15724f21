"""The databases the tests run on: SQLite files and throwaway PostgreSQL databases."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

POSTGRES_URL_ENV = "PSYCH_TEST_POSTGRES_URL"

# The newest migration: what a migrated database reports.
HEAD_REVISION = "0012"


def postgres_admin_url() -> str:
    url = os.environ.get(POSTGRES_URL_ENV)
    if not url:
        pytest.fail(
            f"{POSTGRES_URL_ENV} is not set: run the tests with scripts/test, which starts a "
            "throwaway PostgreSQL (scripts/with-postgres)"
        )
    return url


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A new, empty database on the test PostgreSQL server, dropped afterwards."""
    admin_url = postgres_admin_url()
    name = "t_" + uuid.uuid4().hex[:12]
    # pre-ping: a test may restart the server (test_storage_faults) under a pooled connection.
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    base, _, _ = admin_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()

"""A fresh database on the PostgreSQL server that scripts/with-postgres started."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine, text

POSTGRES_URL_ENV = "PSYCH_TEST_POSTGRES_URL"


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """Create an empty database, yield its URL, drop it afterwards."""
    admin_url = os.environ.get(POSTGRES_URL_ENV)
    if not admin_url:
        raise RuntimeError(
            f"{POSTGRES_URL_ENV} is not set: run PostgreSQL cases under scripts/with-postgres, "
            "e.g. scripts/with-postgres python -m bench"
        )
    name = "bench_" + uuid.uuid4().hex[:12]
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{admin_url.rpartition('/')[0]}/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()

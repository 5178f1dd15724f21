"""Migrations against real databases: the schema they build is the one the code expects."""

from __future__ import annotations

import threading

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from psych_sidecar.storage.db import create_database_engine, current_revision, migrate
from psych_sidecar.storage.tables import metadata


def test_migrations_build_exactly_the_declared_schema(database_url: str) -> None:
    engine = create_database_engine(database_url, pool_size=2)
    try:
        migrate(engine)
        with engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), metadata)
        assert differences == []
        assert current_revision(engine) == "0001"
    finally:
        engine.dispose()


def test_migrations_from_several_sidecars_at_once_run_once(database_url: str) -> None:
    engines = [create_database_engine(database_url, pool_size=1) for _ in range(4)]
    errors: list[BaseException] = []

    def run(engine_index: int) -> None:
        try:
            migrate(engines[engine_index])
        except BaseException as error:  # collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(engines))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert {current_revision(engine) for engine in engines} == {"0001"}
    finally:
        for engine in engines:
            engine.dispose()

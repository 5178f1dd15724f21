"""The round trips a PostgreSQL read or write costs, directly and through PgBouncer in
transaction mode: a plain SELECT opens no transaction, a pooled connection is pinged before use
only after it sat idle, and one that died in the pool is replaced (idle) or fails its one call
as STORAGE_UNAVAILABLE (just used)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text

from psych_sidecar.domain.errors import StorageUnavailable
from psych_sidecar.storage.engines import PING_AFTER_IDLE_SECONDS, create_database_engine
from psych_sidecar.storage.transactions import plain_select, write_transaction
from tests.support.databases import (
    database_of_kind,
    pooling_of,
    postgres_admin_url,
    postgres_database,
)

# In a statement of its own transaction the two are equal; after a BEGIN sent before it (a
# round trip earlier) the transaction's start is earlier than the statement's.
OWN_TRANSACTION = "SELECT now() = statement_timestamp()"
BACKEND = "SELECT pg_backend_pid()"


@pytest.fixture(params=["postgresql", "pgbouncer"])
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with database_of_kind(request.param, tmp_path_factory.mktemp("unused")) as url:
        yield url


@pytest.fixture
def direct_url() -> Iterator[str]:
    """PostgreSQL itself: through PgBouncer a server connection that dies is PgBouncer's to
    replace, and the sidecar's connection to PgBouncer lives on."""
    with postgres_database() as url:
        yield url


def _engine(
    database_url: str, *, ping_after_idle_seconds: float = PING_AFTER_IDLE_SECONDS
) -> Engine:
    return create_database_engine(
        database_url,
        pool_size=1,
        pooling=pooling_of(database_url),
        ping_after_idle_seconds=ping_after_idle_seconds,
    )


def _terminate(pid: int) -> None:
    admin = create_engine(postgres_admin_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        assert connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
    admin.dispose()


def test_a_plain_select_is_its_own_transaction_and_leaves_the_connection_transactional(
    database_url: str,
) -> None:
    engine = _engine(database_url)
    try:
        assert plain_select(engine, OWN_TRANSACTION, ()) == [(True,)]
        # The same pooled connection (a pool of one) opens a transaction for what follows.
        with write_transaction(engine) as connection:
            started_apart = connection.exec_driver_sql(OWN_TRANSACTION).scalar()
        assert started_apart is False
    finally:
        engine.dispose()


def test_a_connection_that_died_idle_in_the_pool_is_replaced_before_use(
    direct_url: str,
) -> None:
    engine = _engine(direct_url, ping_after_idle_seconds=0.0)
    try:
        ((first,),) = plain_select(engine, BACKEND, ())
        _terminate(first)
        ((second,),) = plain_select(engine, BACKEND, ())
        assert second != first
    finally:
        engine.dispose()


def test_a_connection_just_used_is_not_pinged_and_fails_one_call_when_dead(
    direct_url: str,
) -> None:
    engine = _engine(direct_url, ping_after_idle_seconds=3600.0)
    try:
        ((first,),) = plain_select(engine, BACKEND, ())
        _terminate(first)
        with pytest.raises(StorageUnavailable):
            plain_select(engine, BACKEND, ())
        ((second,),) = plain_select(engine, BACKEND, ())
        assert second != first
    finally:
        engine.dispose()

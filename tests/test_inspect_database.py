"""`psych-sidecar inspect --database-url`: the database is opened read-only, never created
and never migrated, and a schema this code does not know is refused (exit 2). The views
themselves are compared with the gRPC mode's in tests/test_inspect.py."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text

from psych_sidecar import cli
from psych_sidecar.storage import tables
from psych_sidecar.storage.engines import create_database_engine
from psych_sidecar.storage.migrate import current_revision, expected_revision, migrate, schema_name
from psych_sidecar.storage.read_only import open_read_only
from psych_sidecar.storage.transactions import read_transaction
from tests.support.databases import postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new database with nothing in it (for SQLite: an empty file)."""
    if request.param == "sqlite":
        path = tmp_path / "empty.db"
        sqlite3.connect(path).close()
        yield f"sqlite:///{path}"
        return
    with postgres_database() as url:
        yield url


@pytest.fixture
def migrated_url(empty_url: str) -> str:
    engine = create_database_engine(empty_url, pool_size=1)
    try:
        migrate(engine)
    finally:
        engine.dispose()
    return empty_url


def set_revision(url: str, revision: str) -> None:
    engine = create_database_engine(url, pool_size=1)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    finally:
        engine.dispose()


def revision_of(url: str) -> str | None:
    engine = create_database_engine(url, pool_size=1)
    try:
        return current_revision(engine)
    finally:
        engine.dispose()


def inspect_runs(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["inspect", "runs", "some-tenant", "--database-url", url])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_missing_sqlite_file_is_refused_and_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "absent" / "sidecar.db"
    code, out, err = inspect_runs(f"sqlite:///{path}", capsys)
    assert code == 2
    assert out == ""
    assert f"no SQLite database at {path}" in err
    assert not path.exists()
    assert not path.parent.exists()


def test_a_database_without_the_schema_is_refused_and_left_alone(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = inspect_runs(empty_url, capsys)
    assert code == 2
    assert out == ""
    assert "no psych-sidecar schema" in err
    assert "psych-sidecar migrate" in err
    # Not migrated: still no table at all.
    engine = create_engine(empty_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            assert not engine.dialect.get_table_names(connection)
    finally:
        engine.dispose()


def test_a_schema_revision_this_code_does_not_know_is_refused(
    migrated_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert inspect_runs(migrated_url, capsys)[0] == 0
    set_revision(migrated_url, "9999_from_a_newer_sidecar")
    code, out, err = inspect_runs(migrated_url, capsys)
    assert code == 2
    assert out == ""
    assert "'9999_from_a_newer_sidecar'" in err
    assert repr(schema_name(expected_revision())) in err
    # The migration's file name, which operators see in the repository, not its revision id.
    versions = Path(tables.__file__).parent / "migrations" / "versions"
    assert (versions / f"{schema_name(expected_revision())}.py").is_file()
    # Never migrated, neither way.
    assert revision_of(migrated_url) == "9999_from_a_newer_sidecar"


def test_the_read_only_engine_cannot_write(migrated_url: str) -> None:
    """Whatever a read path might try, the driver refuses it: SQLite opened mode=ro with
    query_only, PostgreSQL with default_transaction_read_only."""
    engine = open_read_only(migrated_url)
    try:
        insert = tables.specs.insert().values(
            name="s", version=1, body="{}", fingerprint="f", create_time_us=0
        )
        with (
            pytest.raises(Exception, match=r"(?i)read.?only"),
            read_transaction(engine) as connection,
        ):
            connection.execute(insert)
        with read_transaction(engine) as connection:
            assert connection.execute(select(func.count()).select_from(tables.specs)).scalar() == 0
    finally:
        engine.dispose()


def test_a_database_url_and_an_address_are_one_or_the_other(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(
            ["inspect", "runs", "t", "--address", "unix:///x", "--database-url", "sqlite:///x"]
        )
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_an_unsupported_database_url_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = inspect_runs("mysql://localhost/db", capsys)
    assert code == 2
    assert "invalid database URL" in err


def test_the_help_names_both_sources(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["inspect", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "over gRPC" in text
    assert "--database-url straight from its database, opened read-only" in text
    with pytest.raises(SystemExit):
        cli.main(["inspect", "connections", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--address" in text
    assert "--database-url URL" in text


def test_an_unreachable_database_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        # A loopback port nothing listens on: bound, never listened.
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        code, out, err = inspect_runs(f"postgresql://nobody@127.0.0.1:{port}/none", capsys)
    assert code == 1
    assert out == ""
    assert err.startswith("psych-sidecar: cannot use the database postgresql+psycopg://")

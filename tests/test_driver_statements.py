"""The statements run on the driver's cursor come from the tables (storage/statements.py): on
both databases each does what the hand-written SQL it replaced did, a column renamed in the
tables is renamed in them, and a column moved there is refused rather than bound another's
value."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Column, Engine, MetaData, Table, insert
from sqlalchemy.dialects import sqlite

from psych_sidecar.domain.runlog import RecordKind, Spec
from psych_sidecar.storage import tables
from psych_sidecar.storage.engines import create_database_engine
from psych_sidecar.storage.migrate import migrate
from psych_sidecar.storage.repository import SqlStore
from psych_sidecar.storage.statements import (
    DriverStatements,
    compile_statements,
    driver_statements,
)
from psych_sidecar.storage.transactions import driver_write, plain_select

# The SQL these statements were written as by hand, `{m}` the driver's parameter marker.
HAND_WRITTEN = DriverStatements(
    reserve="UPDATE runs SET last_sequence = last_sequence + {m} WHERE run_id = {m} "
    "RETURNING last_sequence",
    claim="INSERT INTO append_requests (run_id, request_id, fingerprint, result, "
    "call_result_outline, call_result_splices) VALUES ({m}, {m}, {m}, {m}, {m}, {m}) "
    "ON CONFLICT DO NOTHING RETURNING request_id",
    prior="SELECT fingerprint, result FROM append_requests WHERE run_id = {m} AND request_id = {m}",
    record="INSERT INTO records (run_id, sequence, kind, create_time_us, handle, call_id, "
    "server, tool, is_error, tool_calls, content_bytes) "
    "VALUES ({m}, {m}, {m}, {m}, {m}, {m}, {m}, {m}, {m}, {m}, {m})",
    part="INSERT INTO record_parts (run_id, sequence, part_index, kind, mime_type, data, "
    "char_count) VALUES ({m}, {m}, {m}, {m}, {m}, {m}, {m})",
    recorded="SELECT 1 FROM append_requests WHERE run_id = {m} AND request_id = {m} "
    "AND call_result_outline IS NOT NULL",
    recorded_or_waiting="SELECT 1 FROM append_requests WHERE run_id = {m} AND request_id = {m} "
    "AND call_result_outline IS NOT NULL UNION ALL "
    "SELECT 1 FROM tool_input_rounds WHERE tool_input_rounds.run_id = {m} "
    "AND tool_input_rounds.request_id = {m} AND tool_input_rounds.outcome IS NULL",
    latest_of_kind="SELECT MAX(sequence) FROM records WHERE run_id = {m} AND kind = {m}",
    connection_versions="SELECT name, revision, catalog_version FROM connections "
    "WHERE tenant = {m} AND delete_time_us IS NULL",
)


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_database_engine(database_url, pool_size=1)
    migrate(engine)
    yield engine
    engine.dispose()


def _hand_written(engine: Engine) -> DriverStatements:
    marker = "?" if engine.dialect.name == "sqlite" else "%s"
    return DriverStatements(
        **{field: sql.format(m=marker) for field, sql in dataclasses.asdict(HAND_WRITTEN).items()}
    )


def _plain(rows: Any) -> list[tuple[Any, ...]]:
    return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in rows]


def _exercise(engine: Engine, sql: DriverStatements, run_id: str) -> list[Any]:
    """Everything an append and the reads around it do, with these statements, in a new Run;
    what each statement answered."""
    answers: list[Any] = []
    with driver_write(engine) as (cursor, _):
        answers.append(_plain(cursor.execute(sql.reserve, (4, run_id)).fetchall()))
        claim = (run_id, "request", "fingerprint", "[[1, 'h']]", b"outline", "[]")
        answers.append(_plain(cursor.execute(sql.claim, claim).fetchall()))
        answers.append(_plain(cursor.execute(sql.claim, claim).fetchall()))
        answers.append(_plain(cursor.execute(sql.prior, (run_id, "request")).fetchall()))
        kinds = [RecordKind.USER_MESSAGE, RecordKind.ASSISTANT_MESSAGE] * 2
        cursor.executemany(
            sql.record,
            [
                (
                    run_id,
                    sequence,
                    kind.value,
                    7,
                    f"{run_id}-{sequence}",
                    "c",
                    "s",
                    "t",
                    True,
                    "[]",
                    3,
                )
                for sequence, kind in enumerate(kinds, start=1)
            ],
        )
        cursor.executemany(
            sql.part,
            [(run_id, 4, 0, "text", "", b"abc", 3), (run_id, 4, 1, "binary", "x/y", b"\0", None)],
        )
    answers.append(_plain(plain_select(engine, sql.recorded, (run_id, "request"))))
    answers.append(_plain(plain_select(engine, sql.recorded, (run_id, "another"))))
    for request_id in ("request", "another"):
        answers.append(
            _plain(
                plain_select(
                    engine, sql.recorded_or_waiting, (run_id, request_id, run_id, request_id)
                )
            )
        )
    for kind in ("user_message", "assistant_message", "no such kind"):
        answers.append(_plain(plain_select(engine, sql.latest_of_kind, (run_id, kind))))
    answers.append(_plain(plain_select(engine, sql.connection_versions, ("tenant",))))
    return answers


def _stored(engine: Engine, run_id: str) -> list[list[tuple[Any, ...]]]:
    """The Run's rows, its id spelled "<run>" (and the Run's create time left out)."""
    stored = []
    with engine.connect() as connection:
        for table in (tables.runs, tables.records, tables.record_parts, tables.append_requests):
            query = table.select().where(table.c.run_id == run_id).order_by(*table.primary_key)
            if table is tables.runs:
                query = query.with_only_columns(table.c.tenant, table.c.last_sequence)
            rows = connection.execute(query)
            stored.append(
                _plain(
                    tuple(v.replace(run_id, "<run>") if isinstance(v, str) else v for v in row)
                    for row in rows
                )
            )
    return stored


def test_generated_statements_do_what_the_hand_written_ones_did(
    engine: Engine, unique: Callable[[str], str]
) -> None:
    store = SqlStore(engine)
    store.insert_spec(Spec(name="agent", version=1))
    with engine.begin() as connection:
        connection.execute(
            insert(tables.connections),
            [
                _connection("live", delete_time_us=None),
                _connection("deleted", delete_time_us=5),
            ],
        )
    by_hand, generated = unique("by-hand"), unique("generated")
    for run_id in (by_hand, generated):
        store.insert_run(run_id, "tenant", "agent", 1, ())
    answers = _exercise(engine, _hand_written(engine), by_hand)
    assert answers == _exercise(engine, driver_statements(engine), generated)
    assert answers[0] == [(4,)]  # the statements did something: sequences were reserved
    assert _stored(engine, by_hand) == _stored(engine, generated)


def _connection(name: str, delete_time_us: int | None) -> dict[str, Any]:
    values: dict[str, Any] = {column.key: "" for column in tables.connections.columns}
    values.update(
        tenant="tenant",
        name=name,
        revision=2,
        preload=None,
        catalog_version=4,
        create_time_us=1,
        update_time_us=1,
        delete_time_us=delete_time_us,
    )
    return values


def _tables_copy(change: Callable[[Table, list[Column[Any]]], list[Column[Any]]]) -> MetaData:
    """A copy of the tables' metadata, each table's columns as `change` gives them."""
    copy = MetaData()
    for table in tables.metadata.sorted_tables:
        columns: list[Column[Any]] = [
            Column(column.name, column.type, key=column.key) for column in table.columns
        ]
        Table(table.name, copy, *change(table, columns))
    return copy


def test_a_column_renamed_in_the_tables_is_renamed_in_the_statements() -> None:
    def rename_kind(table: Table, columns: list[Column[Any]]) -> list[Column[Any]]:
        if table.name != "records":
            return columns
        return [
            Column("record_kind", c.type, key="kind") if c.key == "kind" else c for c in columns
        ]

    dialect = sqlite.dialect()
    before = compile_statements(dialect)
    after = compile_statements(dialect, _tables_copy(rename_kind))
    for sql in (before.latest_of_kind, before.record):
        assert "record_kind" not in sql
    assert "records.record_kind = ?" in after.latest_of_kind
    assert "(run_id, sequence, record_kind, create_time_us" in after.record
    # The rest is the same.
    assert after.reserve == before.reserve
    assert after.part == before.part


def test_a_column_moved_in_its_table_is_refused_not_bound_to_another_value() -> None:
    def move_kind_last(table: Table, columns: list[Column[Any]]) -> list[Column[Any]]:
        if table.name != "records":
            return columns
        return [c for c in columns if c.key != "kind"] + [c for c in columns if c.key == "kind"]

    with pytest.raises(ValueError, match="INSERT INTO records"):
        compile_statements(sqlite.dialect(), _tables_copy(move_kind_last))

"""The SQL text of the statements run straight on a DB-API cursor
(`transactions.plain_select`, `transactions.driver_write`, `loop_connection.LoopConnection`):
those every tool call and ResolveTurn runs, where SQLAlchemy's statement machinery costs
several times the query. Each is a Core statement over the tables of
`tables.py`, compiled once per dialect to the driver's SQL with positional parameters, so a
column changed there changes these too. `compile_statements` names the parameters each binds,
in the order its callers pass them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import (
    ClauseElement,
    Engine,
    Insert,
    MetaData,
    Select,
    Table,
    bindparam,
    func,
    literal_column,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.sql.compiler import SQLCompiler

from psych_sidecar.storage import tables


@dataclass(frozen=True, slots=True)
class DriverStatements:
    """The driver's SQL of each statement; what each binds is listed in `compile_statements`."""

    # The Run's row locked and `count` sequence numbers reserved: its new last sequence.
    reserve: str
    # A request id claimed for a Run (its answer, and a tool call's result outline): no row
    # back when it already was.
    claim: str
    # The fingerprint and answer of a claimed request id.
    prior: str
    # A record's row, and a content part's.
    record: str
    part: str
    # A row when the request id recorded a tool call's result.
    recorded: str
    # A row when the request id recorded a tool call's result or names one waiting for its
    # user's input: the one look-up on the event loop before a call runs.
    recorded_or_waiting: str
    # The sequence of a Run's last record of one kind (the turn's start: its last user
    # message; a tool call's step: its last assistant message), read through the index
    # `ix_records_run_kind`.
    latest_of_kind: str
    # The name, revision and catalogue version of a tenant's connections not deleted.
    connection_versions: str


_Positional = Literal["qmark", "format"]
# The positional spelling of a driver's parameters: psycopg takes %s beside the named
# %(name)s SQLAlchemy gives it.
_POSITIONAL_PARAMSTYLE: dict[str, _Positional] = {
    "qmark": "qmark",
    "format": "format",
    "pyformat": "format",
}
# Compiled at the first engine of each dialect.
_compiled: dict[tuple[type[DefaultDialect], _Positional], DriverStatements] = {}


def driver_statements(engine: Engine) -> DriverStatements:
    """The statements in the SQL of the engine's driver."""
    dialect = engine.dialect
    assert isinstance(dialect, DefaultDialect)
    key = (type(dialect), _POSITIONAL_PARAMSTYLE[dialect.paramstyle])
    statements = _compiled.get(key)
    if statements is None:
        dialect_type, paramstyle = key
        statements = _compiled[key] = compile_statements(dialect_type(paramstyle=paramstyle))
    return statements


def insert_ignoring_conflicts(dialect: Dialect, table: Table) -> Insert:
    """INSERT … ON CONFLICT DO NOTHING, in the dialect's SQL."""
    if dialect.name == "postgresql":
        # Imported here: its dialect costs a SQLite sidecar's start ~40 ms.
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


def compile_statements(dialect: Dialect, metadata: MetaData = tables.metadata) -> DriverStatements:
    """The statements over `metadata`'s tables (those of `tables.py`, or a test's copy), in a
    dialect with positional parameters. Each binds the parameters listed with it, in that
    order: what its callers pass."""
    runs = metadata.tables["runs"]
    records = metadata.tables["records"]
    parts = metadata.tables["record_parts"]
    requests = metadata.tables["append_requests"]
    connections = metadata.tables["connections"]
    rounds = metadata.tables["tool_input_rounds"]

    def sql(statement: ClauseElement, *parameters: str) -> str:
        # An INSERT binds the columns named in its table's order, whatever order they are
        # named in: a column moved there would take another's value, so that is refused here.
        columns = list(parameters) if isinstance(statement, Insert) else None
        compiled = statement.compile(dialect=dialect, column_keys=columns)
        assert isinstance(compiled, SQLCompiler)
        if tuple(compiled.positiontup or ()) != parameters:
            raise ValueError(f"{compiled.string!r} binds {compiled.positiontup}, not {parameters}")
        return compiled.string

    request = (
        requests.c.run_id == bindparam("run_id"),
        requests.c.request_id == bindparam("request_id"),
    )
    recorded: Select[tuple[Any]] = (
        select(literal_column("1"))
        .select_from(requests)
        .where(*request, requests.c.call_result_outline.is_not(None))
    )
    return DriverStatements(
        reserve=sql(
            update(runs)
            .values(last_sequence=runs.c.last_sequence + bindparam("count"))
            .where(runs.c.run_id == bindparam("run_id"))
            .returning(runs.c.last_sequence),
            "count",
            "run_id",
        ),
        claim=sql(
            insert_ignoring_conflicts(dialect, requests).returning(requests.c.request_id),
            "run_id",
            "request_id",
            "fingerprint",
            "result",
            "call_result_outline",
            "call_result_splices",
        ),
        prior=sql(
            select(requests.c.fingerprint, requests.c.result).where(*request),
            "run_id",
            "request_id",
        ),
        record=sql(
            records.insert(),
            "run_id",
            "sequence",
            "kind",
            "create_time_us",
            "handle",
            "call_id",
            "server",
            "tool",
            "is_error",
            "tool_calls",
            "content_bytes",
        ),
        part=sql(
            parts.insert(),
            "run_id",
            "sequence",
            "part_index",
            "kind",
            "mime_type",
            "data",
            "char_count",
        ),
        recorded=sql(recorded, "run_id", "request_id"),
        recorded_or_waiting=sql(
            union_all(
                recorded,
                select(literal_column("1"))
                .select_from(rounds)
                .where(
                    rounds.c.run_id == bindparam("run_id"),
                    rounds.c.request_id == bindparam("request_id"),
                    rounds.c.outcome.is_(None),
                ),
            ),
            "run_id",
            "request_id",
            "run_id",
            "request_id",
        ),
        latest_of_kind=sql(
            select(func.max(records.c.sequence)).where(
                records.c.run_id == bindparam("run_id"), records.c.kind == bindparam("kind")
            ),
            "run_id",
            "kind",
        ),
        connection_versions=sql(
            select(connections.c.name, connections.c.revision, connections.c.catalog_version).where(
                connections.c.tenant == bindparam("tenant"),
                connections.c.delete_time_us.is_(None),
            ),
            "tenant",
        ),
    )

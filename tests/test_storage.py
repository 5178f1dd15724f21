"""Migrations against real databases: the schema they build is the one the code expects."""

from __future__ import annotations

import threading

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.runlog import RecordedCall
from psych_sidecar.storage.engines import create_database_engine
from psych_sidecar.storage.migrate import (
    SCHEMA_HEAD,
    alembic_config,
    current_revision,
    migrate,
    migrations_head,
)
from psych_sidecar.storage.repository import SqlStore
from psych_sidecar.storage.tables import metadata
from tests.support.databases import HEAD_REVISION


def test_the_schema_head_a_start_checks_is_the_newest_migration() -> None:
    # A start compares the stored revision with SCHEMA_HEAD without importing alembic.
    assert SCHEMA_HEAD == migrations_head() == HEAD_REVISION


def test_migrations_build_exactly_the_declared_schema(database_url: str) -> None:
    engine = create_database_engine(database_url, pool_size=2)
    try:
        migrate(engine)
        with engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), metadata)
        assert differences == []
        assert current_revision(engine) == HEAD_REVISION
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
        assert {current_revision(engine) for engine in engines} == {HEAD_REVISION}
    finally:
        for engine in engines:
            engine.dispose()


def test_0002_counts_characters_of_parts_stored_before_it(database_url: str) -> None:
    engine = create_database_engine(database_url, pool_size=1)
    try:
        with engine.connect() as connection:
            command.downgrade(alembic_config(connection), "0001")
            connection.commit()
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO specs (name, version, body, fingerprint, create_time_us) "
                    "VALUES ('s', 1, '{}', 'f', 0)"
                )
            )
            connection.execute(
                text(
                    "INSERT INTO runs (run_id, tenant, spec_name, spec_version, "
                    "tool_restrictions, create_time_us, last_sequence) "
                    "VALUES ('run_old', 't', 's', 1, '[]', 0, 1)"
                )
            )
            connection.execute(
                text(
                    "INSERT INTO records (run_id, sequence, kind, create_time_us, handle, call_id, "
                    "server, tool, is_error, tool_calls, content_bytes) "
                    "VALUES ('run_old', 1, 'tool_result', 0, 'h_old', 'c', '', '', false, '[]', 9)"
                )
            )
            for index, kind, data in [
                (0, "text", "héllo🙂".encode()),
                (1, "binary", b"\xff\x00"),
                (2, "json", b'{"a":"\xc3\xa9"}'),
            ]:
                connection.execute(
                    text(
                        "INSERT INTO record_parts (run_id, sequence, part_index, kind, mime_type, "
                        "data) VALUES ('run_old', 1, :i, :k, '', :d)"
                    ),
                    {"i": index, "k": kind, "d": data},
                )
        migrate(engine)
        with engine.connect() as connection:
            counts = connection.execute(
                text("SELECT char_count FROM record_parts ORDER BY part_index")
            ).scalars()
            assert list(counts) == [6, None, 9]
    finally:
        engine.dispose()


def test_calls_recorded_before_the_log_answered_retries_are_converted_to_references(
    database_url: str,
) -> None:
    """A retried call recorded with its whole result JSON is answered the same after the
    migration, from the log: what append_requests keeps shrinks to what the log lacks."""
    text_part = 'a "quoted" line\n' * 40
    spliced = canonical_json({"content": [{"type": "text", "text": text_part}], "isError": False})
    # A result whose text the log does not hold as spelled: it stays whole.
    unmatched = canonical_json({"content": [{"type": "text", "text": "z" * 200}]})
    engine = create_database_engine(database_url, pool_size=1)
    try:
        with engine.connect() as connection:
            command.downgrade(alembic_config(connection), "0012")
            connection.commit()
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO specs (name, version, body, fingerprint, create_time_us) "
                    "VALUES ('s_calls', 1, '{}', 'f', 0)"
                )
            )
            connection.execute(
                text(
                    "INSERT INTO runs (run_id, tenant, spec_name, spec_version, "
                    "tool_restrictions, create_time_us, last_sequence) "
                    "VALUES ('run_calls', 't', 's_calls', 1, '[]', 0, 2)"
                )
            )
            for sequence, result_json in [(1, spliced), (2, unmatched)]:
                connection.execute(
                    text(
                        "INSERT INTO records (run_id, sequence, kind, create_time_us, handle, "
                        "call_id, server, tool, is_error, tool_calls, content_bytes) "
                        "VALUES ('run_calls', :s, 'tool_result', 0, :h, 'c', 'srv', 'tool', "
                        "false, '[]', 640)"
                    ),
                    {"s": sequence, "h": f"h_calls{sequence}"},
                )
                connection.execute(
                    text(
                        "INSERT INTO record_parts (run_id, sequence, part_index, kind, "
                        "mime_type, data) VALUES ('run_calls', :s, 0, 'text', '', :d)"
                    ),
                    {"s": sequence, "d": text_part.encode()},
                )
                connection.execute(
                    text(
                        "INSERT INTO append_requests (run_id, request_id, fingerprint, result, "
                        "call_result_json) VALUES ('run_calls', :r, 'f', :a, :j)"
                    ),
                    {
                        "r": f"call-{sequence}",
                        "a": f'[[{sequence}, "h_calls{sequence}"]]',
                        "j": result_json,
                    },
                )
        migrate(engine)
        store = SqlStore(engine)
        for sequence, result_json in [(1, spliced), (2, unmatched)]:
            recorded = store.recorded_call("run_calls", f"call-{sequence}")
            assert recorded == RecordedCall(sequence, f"h_calls{sequence}", False, result_json)
        with engine.connect() as connection:
            kept: dict[str, bytes] = dict(
                connection.execute(
                    text(
                        "SELECT request_id, call_result_outline FROM append_requests "
                        "WHERE run_id = 'run_calls'"
                    )
                ).all()
            )
        assert kept["call-1"] == b'{"content":[{"type":"text","text":}],"isError":false}'
        assert kept["call-2"] == unmatched
        # Back down, the whole result JSON is there again.
        with engine.connect() as connection:
            command.downgrade(alembic_config(connection), "0012")
            connection.commit()
        with engine.connect() as connection:
            restored = connection.execute(
                text(
                    "SELECT call_result_json FROM append_requests WHERE run_id = 'run_calls' "
                    "ORDER BY request_id"
                )
            ).scalars()
            assert [bytes(value) for value in restored] == [spliced, unmatched]
        migrate(engine)
    finally:
        engine.dispose()

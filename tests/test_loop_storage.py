"""A tool call's storage steps tried on the event loop's thread (SQLite, `NoWaitSqlite`): they
write what the worker path writes, never wait for a lock, leave nothing behind when they give
up, refuse SQLAlchemy's transactions, and leave checkpoints to a worker.

Real SQLite files; the competing writer is a second real connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from psych_sidecar.domain.runlog import (
    ContentPart,
    NotForTheEventLoop,
    PartKind,
    Record,
    RecordKind,
    RunService,
    Spec,
    SpecService,
)
from psych_sidecar.storage.db import (
    NoWaitSqlite,
    create_database_engine,
    migrate,
    plain_select,
    settle_freed_content,
    shared_reads,
    transaction,
)
from psych_sidecar.storage.log_reads import SqlLogReader
from psych_sidecar.storage.repository import SqlStore


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    created = create_database_engine(f"sqlite:///{tmp_path / 'sidecar.db'}", pool_size=2)
    migrate(created)
    yield created
    created.dispose()


@pytest.fixture
def no_wait(engine: Engine) -> Iterator[NoWaitSqlite]:
    checkpoints: list[Callable[[], None]] = []
    made = NoWaitSqlite(engine, background=checkpoints.append)
    yield made
    made.close()


def _runs(engine: Engine) -> RunService:
    store = SqlStore(engine)
    SpecService(store).publish(Spec(name="s", version=1))
    return RunService(store, store)


def _result(text: str) -> tuple[Record, ...]:
    part = ContentPart(PartKind.TEXT, text.encode())
    return (Record(RecordKind.TOOL_RESULT, content=(part,), call_id="c", server="fx", tool="t"),)


def _rows(engine: Engine, run_id: str) -> list[tuple[object, ...]]:
    return [
        tuple(row)
        for row in plain_select(
            engine,
            "SELECT r.sequence, r.kind, r.handle IS NOT NULL, r.call_id, r.server, r.tool, "
            "r.is_error, r.tool_calls, r.content_bytes, p.part_index, p.kind, p.mime_type, "
            "p.data, p.char_count FROM records r JOIN record_parts p "
            "ON p.run_id = r.run_id AND p.sequence = r.sequence WHERE r.run_id = ? "
            "ORDER BY r.sequence",
            (run_id,),
        )
    ]


def test_an_append_on_the_loop_writes_what_a_worker_writes_and_answers_its_retry(
    engine: Engine, no_wait: NoWaitSqlite
) -> None:
    runs = _runs(engine)
    on_loop = runs.create("t", "s", 1, ())
    on_worker = runs.create("t", "s", 1, ())
    with no_wait.bound():
        (loop_appended,) = runs.append(on_loop.run_id, "r1", _result("hé"), b'{"a":1}')
    (worker_appended,) = runs.append(on_worker.run_id, "r1", _result("hé"), b'{"a":1}')
    assert loop_appended.sequence == worker_appended.sequence == 1
    assert _rows(engine, on_loop.run_id) == _rows(engine, on_worker.run_id)
    # The same request again is the first answer, on either path.
    with no_wait.bound():
        assert runs.append(on_loop.run_id, "r1", _result("hé"), b'{"a":1}') == [loop_appended]
    # A recorded answer is read on a worker: its look-up says so on the loop.
    with pytest.raises(NotForTheEventLoop), no_wait.bound():
        runs.recorded_call(on_loop.run_id, "r1")
    recorded = runs.recorded_call(on_loop.run_id, "r1")
    assert recorded is not None
    assert (recorded.sequence, recorded.handle) == (1, loop_appended.handle)


def test_the_loop_never_waits_for_a_writer_and_leaves_nothing_when_it_gives_up(
    engine: Engine, no_wait: NoWaitSqlite, tmp_path: Path
) -> None:
    runs = _runs(engine)
    run = runs.create("t", "s", 1, ())
    writer = sqlite3.connect(tmp_path / "sidecar.db", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        with pytest.raises(NotForTheEventLoop), no_wait.bound():
            runs.append(run.run_id, "r1", _result("x"), b"{}")
        # A WAL reader does not wait for the writer: reads still answer on the loop.
        with no_wait.bound(), shared_reads(engine):
            assert SqlLogReader(engine).latest_assistant_sequence(run.run_id) == 0
        writer.execute("ROLLBACK")
    finally:
        writer.close()
    assert _rows(engine, run.run_id) == []
    # Given up, the worker path does it, as the first and only append.
    (appended,) = runs.append(run.run_id, "r1", _result("x"), b"{}")
    assert appended.sequence == 1


def test_the_loop_refuses_sqlalchemy_transactions_and_values_streamed_into_rows(
    engine: Engine, no_wait: NoWaitSqlite
) -> None:
    runs = _runs(engine)
    run = runs.create("t", "s", 1, ())
    with pytest.raises(NotForTheEventLoop), no_wait.bound(), transaction(engine, write=False):
        pass
    huge = "x" * (2 << 20)
    with pytest.raises(NotForTheEventLoop), no_wait.bound():
        runs.append(run.run_id, "r1", _result(huge), None)
    assert _rows(engine, run.run_id) == []
    runs.append(run.run_id, "r1", _result(huge), None)
    ((content_bytes,),) = plain_select(
        engine, "SELECT content_bytes FROM records WHERE run_id = ?", (run.run_id,)
    )
    assert content_bytes == len(huge)


def test_a_connection_in_use_is_not_waited_for(no_wait: NoWaitSqlite) -> None:
    with no_wait.bound(), pytest.raises(NotForTheEventLoop), no_wait.bound():
        pass
    no_wait.close()
    with pytest.raises(NotForTheEventLoop), no_wait.bound():
        pass


def test_checkpoints_are_handed_to_a_worker_once_the_log_grows(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[Callable[[], None]] = []
    no_wait = NoWaitSqlite(engine, background=handed.append)
    monkeypatch.setattr(NoWaitSqlite, "CHECKPOINT_EVERY", 4)
    monkeypatch.setattr(NoWaitSqlite, "CHECKPOINT_WAL_BYTES", 1 << 20)
    runs = _runs(engine)
    run = runs.create("t", "s", 1, ())
    settle_freed_content(engine)  # the log emptied: what follows is the appends' alone
    try:
        for index in range(4):
            with no_wait.bound():
                runs.append(run.run_id, f"small{index}", _result("x"), b"{}")
        assert handed == []  # the log is still small
        for index in range(4):
            with no_wait.bound():
                runs.append(run.run_id, f"large{index}", _result("y" * 400_000), b"{}")
        assert len(handed) == 1
        handed[0]()  # on a worker: a passive checkpoint through the pool
    finally:
        no_wait.close()


def test_a_checkpoint_that_fails_is_logged(
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    handed: list[Callable[[], None]] = []
    no_wait = NoWaitSqlite(engine, background=handed.append)
    monkeypatch.setattr(NoWaitSqlite, "CHECKPOINT_EVERY", 1)
    monkeypatch.setattr(NoWaitSqlite, "CHECKPOINT_WAL_BYTES", 0)
    runs = _runs(engine)
    run = runs.create("t", "s", 1, ())
    try:
        with no_wait.bound():
            runs.append(run.run_id, "one", _result("x"), b"{}")
        assert len(handed) == 1
        # The database gone from under the pool: the worker's connection cannot open it.
        engine.dispose()
        database = tmp_path / "sidecar.db"
        database.rename(tmp_path / "moved.db")
        database.mkdir()
        handed[0]()
    finally:
        no_wait.close()
    assert "checkpointing the SQLite write-ahead log failed" in caplog.text


def test_the_latest_record_of_a_kind_is_read_through_its_index(engine: Engine) -> None:
    plan = plain_select(
        engine,
        "EXPLAIN QUERY PLAN SELECT MAX(sequence) FROM records WHERE run_id = ? AND kind = ?",
        ("r", "user_message"),
    )
    assert any("ix_records_run_kind" in str(row[-1]) for row in plan), plan

"""The storage's answers on the event loop's thread (SQLite: `SqliteNow` over a
`LoopConnection`): they write what the worker path writes, never wait for a lock, leave
nothing behind when they say "not now", and leave checkpoints to a worker. Any other storage
call on the loop fails loudly (a pooled connection checked out there).

Real SQLite files; the competing writer is a second real connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from psych.sidecar.v1 import (
    content_pb2,
    run_pb2,
    run_service_pb2,
    spec_pb2,
    tool_service_pb2,
    turn_service_pb2,
)
from psych_sidecar.domain.errors import Reason, SidecarError
from psych_sidecar.domain.runlog import (
    ContentPart,
    PartKind,
    Record,
    RecordKind,
    RunService,
    Spec,
    SpecService,
)
from psych_sidecar.storage.engines import (
    PooledConnectionOnTheEventLoop,
    create_database_engine,
    settle_freed_content,
)
from psych_sidecar.storage.log_reads import SqlLogReader
from psych_sidecar.storage.loop_connection import LoopConnection
from psych_sidecar.storage.migrate import migrate
from psych_sidecar.storage.now import SqliteNow
from psych_sidecar.storage.repository import SqlStore
from psych_sidecar.storage.transactions import plain_select, read_transaction
from tests.support.connections import fixture_commands, put_stdio
from tests.support.databases import TEST_SECRET_KEY
from tests.support.requests import publish, user
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar
from tests.support.storage_now import storage_now


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    created = create_database_engine(f"sqlite:///{tmp_path / 'sidecar.db'}", pool_size=2)
    migrate(created)
    yield created
    created.dispose()


@pytest.fixture
def loop_connection(engine: Engine) -> Iterator[LoopConnection]:
    checkpoints: list[Callable[[], None]] = []
    made = LoopConnection(engine, background=checkpoints.append)
    yield made
    made.close()


@pytest.fixture
def now(loop_connection: LoopConnection) -> SqliteNow:
    return storage_now(loop_connection)


def _runs(engine: Engine) -> RunService:
    store = SqlStore(engine)
    SpecService(store).publish(Spec(name="s", version=1))
    return RunService(store, runs=store)


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


def test_an_append_now_writes_what_a_worker_writes_and_answers_its_retry(
    engine: Engine, now: SqliteNow
) -> None:
    runs = _runs(engine)
    on_loop = runs.create("t", "s", 1, ())
    on_worker = runs.create("t", "s", 1, ())
    assert now.call_unrecorded(on_loop.run_id, "r1")
    loop_appended = runs.append_now(now, on_loop.run_id, "r1", _result("hé"), b'{"a":1}')
    (worker_appended,) = runs.append(on_worker.run_id, "r1", _result("hé"), b'{"a":1}')
    assert loop_appended is not None
    assert loop_appended[0].sequence == worker_appended.sequence == 1
    assert _rows(engine, on_loop.run_id) == _rows(engine, on_worker.run_id)
    # The same request again is the first answer, on either path.
    assert runs.append_now(now, on_loop.run_id, "r1", _result("hé"), b'{"a":1}') == loop_appended
    assert runs.append(on_loop.run_id, "r1", _result("hé"), b'{"a":1}') == loop_appended
    # A recorded answer is read on a worker: the loop says only that there is one.
    assert not now.call_unrecorded(on_loop.run_id, "r1")
    recorded = runs.recorded_call(on_loop.run_id, "r1")
    assert recorded is not None
    assert (recorded.sequence, recorded.handle) == (1, loop_appended[0].handle)
    assert now.latest_assistant_sequence(on_loop.run_id) == 0
    assert now.connection_versions("t") == {}


def test_an_append_now_answers_with_the_typed_errors_and_writes_nothing(
    engine: Engine, now: SqliteNow
) -> None:
    runs = _runs(engine)
    run = runs.create("t", "s", 1, ())
    with pytest.raises(SidecarError) as unknown:
        runs.append_now(now, "run_unknown", "r1", _result("x"), b"{}")
    assert unknown.value.reason is Reason.RUN_NOT_FOUND
    runs.append_now(now, run.run_id, "r1", _result("x"), b"{}")
    with pytest.raises(SidecarError) as reused:
        runs.append_now(now, run.run_id, "r1", _result("other"), b"{}")
    assert reused.value.reason is Reason.REQUEST_ID_REUSED
    assert [row[0] for row in _rows(engine, run.run_id)] == [1]


def test_it_never_waits_for_a_writer_and_leaves_nothing_when_it_says_not_now(
    engine: Engine, now: SqliteNow, tmp_path: Path
) -> None:
    runs = _runs(engine)
    run = runs.create("t", "s", 1, ())
    writer = sqlite3.connect(tmp_path / "sidecar.db", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        assert runs.append_now(now, run.run_id, "r1", _result("x"), b"{}") is None
        # A WAL reader does not wait for the writer: reads still answer on the loop.
        assert now.latest_assistant_sequence(run.run_id) == 0
        assert now.turn_start(run.run_id) == 0
        writer.execute("ROLLBACK")
    finally:
        writer.close()
    assert _rows(engine, run.run_id) == []
    # Not now: the worker path does it, as the first and only append.
    (appended,) = runs.append(run.run_id, "r1", _result("x"), b"{}")
    assert appended.sequence == 1


def test_values_streamed_into_their_rows_are_never_now(engine: Engine, now: SqliteNow) -> None:
    runs = _runs(engine)
    run = runs.create("t", "s", 1, ())
    huge = "x" * (2 << 20)
    assert runs.append_now(now, run.run_id, "r1", _result(huge), None) is None
    assert _rows(engine, run.run_id) == []
    runs.append(run.run_id, "r1", _result(huge), None)
    ((content_bytes,),) = plain_select(
        engine, "SELECT content_bytes FROM records WHERE run_id = ?", (run.run_id,)
    )
    assert content_bytes == len(huge)


def test_a_connection_in_use_or_closed_is_not_waited_for(loop_connection: LoopConnection) -> None:
    inner: list[object] = []

    def statements(_cursor: sqlite3.Cursor) -> str:
        inner.append(loop_connection.select_now("SELECT 1", ()))
        return "written"

    assert loop_connection.write_now(statements) == "written"
    assert inner == [None]  # in use by the write: not now
    assert loop_connection.select_now("SELECT 1", ()) == [(1,)]
    loop_connection.close()
    assert loop_connection.select_now("SELECT 1", ()) is None
    assert loop_connection.write_now(lambda _cursor: 1) is None


def test_a_pooled_connection_on_the_event_loop_fails_loudly(engine: Engine, now: SqliteNow) -> None:
    reader = SqlLogReader(engine)

    async def on_the_loop() -> int | None:
        with pytest.raises(PooledConnectionOnTheEventLoop):
            reader.turn_start("run_x")
        with pytest.raises(PooledConnectionOnTheEventLoop), read_transaction(engine):
            pass
        return now.turn_start("run_x")  # the loop's own connection is what answers there

    assert asyncio.run(on_the_loop()) == 0
    # Off the loop the pool serves as before.
    assert reader.turn_start("run_x") == 0


def test_checkpoints_are_handed_to_a_worker_once_the_log_grows(engine: Engine) -> None:
    handed: list[Callable[[], None]] = []
    loop = LoopConnection(
        engine, background=handed.append, checkpoint_every=4, checkpoint_wal_bytes=1 << 20
    )
    now = storage_now(loop)
    runs = _runs(engine)
    run = runs.create("t", "s", 1, ())
    settle_freed_content(engine)  # the log emptied: what follows is the appends' alone
    try:
        for index in range(4):
            assert runs.append_now(now, run.run_id, f"small{index}", _result("x"), b"{}")
        assert handed == []  # the log is still small
        for index in range(4):
            assert runs.append_now(now, run.run_id, f"large{index}", _result("y" * 400_000), b"{}")
        assert len(handed) == 1
        handed[0]()  # on a worker: a passive checkpoint through the pool
    finally:
        loop.close()


def test_a_checkpoint_that_fails_is_logged(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    handed: list[Callable[[], None]] = []
    loop = LoopConnection(
        engine, background=handed.append, checkpoint_every=1, checkpoint_wal_bytes=0
    )
    runs = _runs(engine)
    run = runs.create("t", "s", 1, ())
    try:
        assert runs.append_now(storage_now(loop), run.run_id, "one", _result("x"), b"{}")
        assert len(handed) == 1
        # The database gone from under the pool: the worker's connection cannot open it.
        engine.dispose()
        database = tmp_path / "sidecar.db"
        database.rename(tmp_path / "moved.db")
        database.mkdir()
        handed[0]()
    finally:
        loop.close()
    assert "checkpointing the SQLite write-ahead log failed" in caplog.text


def test_the_latest_record_of_a_kind_is_read_through_its_index(engine: Engine) -> None:
    plan = plain_select(
        engine,
        "EXPLAIN QUERY PLAN SELECT MAX(sequence) FROM records WHERE run_id = ? AND kind = ?",
        ("r", "user_message"),
    )
    assert any("ix_records_run_kind" in str(row[-1]) for row in plan), plan


def _scrape(running: RunningSidecar) -> dict[tuple[str, str], float]:
    """The sidecar's loop-storage answers by outcome, and its hops to a thread pool."""
    assert running.sidecar.admin is not None
    with urllib.request.urlopen(running.sidecar.admin.bound[0] + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (sample.name, sample.labels.get("outcome", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name
        in ("psych_sidecar_loop_storage_attempts_total", "psych_sidecar_storage_wait_seconds_count")
    }


def test_tool_calls_and_resolve_turn_answer_on_the_loop_over_grpc(tmp_path: Path) -> None:
    """The real sidecar on SQLite: once a Run's first call has filled the caches, every tool
    call's reads and append and every ResolveTurn of the turn are answered on the event loop
    (no storage answer "not now", no hop to a thread pool but AppendRecords'), and nothing
    trips the guard on pooled connections (an RPC would fail)."""
    settings = flat_settings(
        listen=["127.0.0.1:0"],
        admin_listen=["127.0.0.1:0"],
        database_url=f"sqlite:///{tmp_path / 'sidecar.db'}",
        data_dir=tmp_path,
        shutdown_grace_seconds=5,
        secret_keys=TEST_SECRET_KEY,
        mcp_commands=fixture_commands(),
        # The look for due tool tasks is a hop too: only the one at start, none while measured.
        task_look_seconds=3600,
        task_poll_min_seconds=3600,
    )
    with RunningSidecar(settings) as running, running.stubs() as stubs:
        put_stdio(stubs, "acme", "fx", preload=True)
        publish(stubs, "s", grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
        run_id = stubs.runs.CreateRun(
            run_service_pb2.CreateRunRequest(tenant="acme", spec_name="s", spec_version=1)
        ).run.run_id
        resolve = turn_service_pb2.ResolveTurnRequest(run_id=run_id)

        def step(call_id: str) -> bytes:
            """The model's next step calling fx__echo: appended, resolved, dispatched."""
            call = content_pb2.ToolCall(
                call_id=call_id, name="fx__echo", arguments_json='{"text": "hi"}'
            )
            message = run_pb2.Record(assistant_message=run_pb2.AssistantMessage(tool_calls=[call]))
            stubs.runs.AppendRecords(
                run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[message])
            )
            stubs.turns.ResolveTurn(resolve)
            outcome = stubs.tools.DispatchToolCall(
                tool_service_pb2.DispatchToolCallRequest(run_id=run_id, call=call), timeout=30
            ).outcome
            assert not outcome.is_error, outcome.result_json
            return outcome.result_json

        stubs.runs.AppendRecords(
            run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user("go")])
        )
        step("warm")  # the Run, its Spec and its surface read into memory
        before = _scrape(running)
        steps = 3
        for index in range(steps):
            assert b"hi" in step(f"call{index}")
        after = _scrape(running)

    def delta(name: str, outcome: str = "") -> float:
        return after.get((name, outcome), 0.0) - before.get((name, outcome), 0.0)

    assert delta("psych_sidecar_loop_storage_attempts_total", "worker") == 0
    # Per step: ResolveTurn's turn start; the call's connection versions, assistant step,
    # recorded-answer check and append.
    assert delta("psych_sidecar_loop_storage_attempts_total", "done") == 5 * steps
    assert delta("psych_sidecar_storage_wait_seconds_count") == steps  # AppendRecords' hops only

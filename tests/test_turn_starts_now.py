"""ResolveTurn's read on the event loop (SQLite): `SqliteNow.turn_start` answers what the
pooled reader answers, sees every commit at once, and says None instead of waiting.

Real SQLite files written by the real sidecar over gRPC; the lock is a second real
connection holding the database in exclusive locking mode.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    connection_service_pb2_grpc,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    spec_service_pb2,
    spec_service_pb2_grpc,
    turn_service_pb2,
    turn_service_pb2_grpc,
)
from psych_sidecar.storage.engines import create_database_engine
from psych_sidecar.storage.log_reads import SqlLogReader
from psych_sidecar.storage.loop_connection import LoopConnection
from psych_sidecar.storage.now import SqliteNow
from tests.support.processes import free_port
from tests.support.requests import user
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar
from tests.support.storage_now import storage_now


@contextlib.contextmanager
def _serving(path: Path, data_dir: Path) -> Iterator[tuple[RunningSidecar, grpc.Channel]]:
    """A sidecar on the SQLite file at `path`, and a channel to it."""
    settings = flat_settings(
        listen=["127.0.0.1:0"],
        database_url=f"sqlite:///{path}",
        data_dir=data_dir,
        shutdown_grace_seconds=5,
    )
    with (
        RunningSidecar(settings) as running,
        grpc.insecure_channel(running.sidecar.bound[0]) as channel,
    ):
        yield running, channel


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[RunningSidecar, grpc.Channel, Path]]:
    path = tmp_path / "sidecar.db"
    with _serving(path, tmp_path) as (running, channel):
        yield running, channel, path


@pytest.fixture
def engine(served: tuple[RunningSidecar, grpc.Channel, Path]) -> Iterator[Engine]:
    created = create_database_engine(f"sqlite:///{served[2]}", pool_size=1)
    yield created
    created.dispose()


@contextlib.contextmanager
def _turn_starts_now(engine: Engine) -> Iterator[SqliteNow]:
    """The storage's answers on the loop over a `LoopConnection` of `engine`, closed at the
    end."""
    loop = LoopConnection(engine, background=lambda work: work())
    try:
        yield storage_now(loop)
    finally:
        loop.close()


def _new_run(
    channel: grpc.Channel,
    unique: Any,
    tenant: str = "t",
    grants: Sequence[spec_pb2.ToolGrant] = (),
) -> str:
    spec = spec_pb2.Spec(name=unique("spec"), version=1, grants=grants)
    spec_service_pb2_grpc.SpecServiceStub(channel).PublishSpec(
        spec_service_pb2.PublishSpecRequest(spec=spec)
    )
    request = run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec.name, spec_version=1)
    return run_service_pb2_grpc.RunServiceStub(channel).CreateRun(request).run.run_id


def _say(channel: grpc.Channel, run_id: str, text: str) -> None:
    run_service_pb2_grpc.RunServiceStub(channel).AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user(text)])
    )


def test_it_answers_what_the_pooled_reader_answers_and_sees_each_commit_at_once(
    served: tuple[RunningSidecar, grpc.Channel, Path], engine: Engine, unique: Any
) -> None:
    _, channel, _ = served
    pooled = SqlLogReader(engine)
    with _turn_starts_now(engine) as now:
        run_id = _new_run(channel, unique)
        assert now.turn_start(run_id) == pooled.turn_start(run_id) == 0
        assert now.turn_start("no-such-run") == 0
        for turn in range(3):
            # Another connection (the sidecar's) commits; the next read sees it: no read
            # transaction of the last call is left open.
            _say(channel, run_id, f"turn {turn}")
            start = now.turn_start(run_id)
            assert start == pooled.turn_start(run_id)
            assert start is not None
            assert start > 0
    assert now.turn_start(run_id) is None  # closed: the caller takes the worker path


def test_it_says_none_rather_than_wait_for_a_lock(tmp_path: Path, unique: Any) -> None:
    path = tmp_path / "sidecar.db"
    with _serving(path, tmp_path) as (_, channel):
        run_id = _new_run(channel, unique)
        _say(channel, run_id, "hello")
    engine = create_database_engine(f"sqlite:///{path}", pool_size=1)
    expected = SqlLogReader(engine).turn_start(run_id)
    engine.dispose()
    with _turn_starts_now(engine) as now:
        _refused_while_locked_then_answered(path, now, run_id, expected)


def _refused_while_locked_then_answered(
    path: Path, now: SqliteNow, run_id: str, expected: int
) -> None:
    # With nobody else on the file, a connection in exclusive locking mode keeps the lock
    # it takes (and the WAL index to itself) until it closes: every other reader is refused.
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("COMMIT")
        assert now.turn_start(run_id) is None
    finally:
        holder.close()
    assert expected > 0
    assert now.turn_start(run_id) == expected


def test_resolve_turn_answers_a_new_turn_written_by_another_sidecar_on_the_same_file(
    served: tuple[RunningSidecar, grpc.Channel, Path], tmp_path: Path, unique: Any
) -> None:
    """The first sidecar pinned the turn in memory; a second one on the same SQLite file
    starts the next turn; the first must see it (its loop read is not a cache)."""
    _, channel, path = served
    grants = [spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")]
    run_id = _new_run(channel, unique, tenant="t2", grants=grants)
    turns = turn_service_pb2_grpc.TurnServiceStub(channel)
    request = turn_service_pb2.ResolveTurnRequest(run_id=run_id)
    _say(channel, run_id, "first")
    before = turns.ResolveTurn(request).surface
    assert list(before.servers) == []
    assert turns.ResolveTurn(request).surface == before  # pinned: now answered on the loop

    with _serving(path, tmp_path / "second") as (_, other):
        connection = connection_pb2.Connection(
            tenant="t2",
            name="late",
            http=connection_pb2.HttpTransport(
                url=f"http://127.0.0.1:{free_port()}/mcp",
                protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
            ),
        )
        connection_service_pb2_grpc.ConnectionServiceStub(other).PutConnection(
            connection_service_pb2.PutConnectionRequest(connection=connection)
        )
        # Mid-turn, the first sidecar still serves the pinned surface.
        assert turns.ResolveTurn(request).surface == before
        _say(other, run_id, "second")
    after = turns.ResolveTurn(request).surface
    assert [line.server for line in after.servers] == ["late"]

"""A database that cannot be used just now is UNAVAILABLE / STORAGE_UNAVAILABLE with retry
advice, never INTERNAL; the sidecar recovers by itself when the database is back.

SQLite: another process holds the write lock past the busy timeout. PostgreSQL: another
session holds the Run's row lock past the lock timeout, the database refuses connections (its
backends terminated) for a while, and a durable cluster of the test's own crashes and restarts
during appends.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sqlalchemy import create_engine, make_url, text

from psych.sidecar.v1 import (
    run_service_pb2,
)
from psych_sidecar.storage.engines import normalize_url
from tests.support.databases import TEST_SECRET_KEY, postgres_admin_url
from tests.support.polling import wait_for
from tests.support.postgres_cluster import Cluster, own_cluster
from tests.support.requests import all_records, new_run, user
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

BUSY_TIMEOUT = 0.3


# One transport is enough here: the faults are in the database, not the socket.
SIDECAR_TRANSPORTS = ["tcp"]


# A short busy timeout, so a held lock answers within the test's patience.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "database_busy_timeout_seconds": BUSY_TIMEOUT,
    "worker_threads": 2,
}


def _append(stubs: Stubs, run_id: str, request_id: str, text_value: str) -> Any:
    return stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(
            run_id=run_id, request_id=request_id, records=[user(text_value)]
        ),
        timeout=30,
    )


def _assert_storage_unavailable(call: Any) -> None:
    failure = rpc_failure(call)
    assert failure.code == grpc.StatusCode.UNAVAILABLE
    assert failure.info.reason == "STORAGE_UNAVAILABLE"
    assert failure.info.metadata["detail"]
    # The retry advice travels beside the one ErrorInfo.
    assert failure.detail_count == 2


def _retry_info(call: Any) -> error_details_pb2.RetryInfo:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    status = rpc_status.from_call(caught.value)
    assert status is not None
    for detail in status.details:
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return info
    raise AssertionError("no RetryInfo")


@contextlib.contextmanager
def _lock_held(grpc_server: RunningSidecar, run_id: str) -> Iterator[None]:
    """Another client holds the lock an append needs, for as long as the block runs."""
    url = normalize_url(grpc_server.settings.storage.database_url)
    if url.get_backend_name() == "sqlite":
        holder = sqlite3.connect(str(url.database), isolation_level=None, timeout=30)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    engine = create_engine(url)
    with engine.connect() as connection:
        connection.execute(
            text("SELECT 1 FROM runs WHERE run_id = :run_id FOR UPDATE"), {"run_id": run_id}
        )
        try:
            yield
        finally:
            connection.rollback()
    engine.dispose()


def test_lock_held_past_the_busy_timeout_is_retryable_and_the_retry_stores_once(
    grpc_server: RunningSidecar, stubs: Stubs, unique: Any
) -> None:
    run_id = new_run(stubs, unique("spec"))
    with _lock_held(grpc_server, run_id):
        _assert_storage_unavailable(lambda: _append(stubs, run_id, "r1", "hello"))
        delay = _retry_info(lambda: _append(stubs, run_id, "r1", "hello")).retry_delay
        assert delay.ToNanoseconds() > 0
        # Reads are not blocked by a writer.
        assert stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=run_id)).run.run_id
    first = _append(stubs, run_id, "r1", "hello")
    again = _append(stubs, run_id, "r1", "hello")
    assert [r.sequence for r in first.records] == [r.sequence for r in again.records] == [1]
    assert len(all_records(stubs, run_id)) == 1


def test_postgresql_refusing_connections_is_unavailable_then_recovers(
    grpc_server: RunningSidecar, stubs: Stubs, unique: Any
) -> None:
    url = make_url(grpc_server.settings.storage.database_url)
    if url.get_backend_name() != "postgresql":
        pytest.skip("a PostgreSQL outage")
    run_id = new_run(stubs, unique("spec"))
    _append(stubs, run_id, "before", "one")
    admin = create_engine(postgres_admin_url(), isolation_level="AUTOCOMMIT")
    name = url.database

    def set_allowed(allowed: bool) -> None:
        with admin.connect() as connection:
            connection.execute(
                text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
            )
            if not allowed:
                connection.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": name},
                )

    set_allowed(False)
    try:
        for request_id in ("during-1", "during-2", "during-3"):
            _assert_storage_unavailable(lambda r=request_id: _append(stubs, run_id, r, "two"))
    finally:
        set_allowed(True)
        admin.dispose()
    # Back without restarting the sidecar: the retry with the same request id stores once.
    _append(stubs, run_id, "during-1", "two")
    _append(stubs, run_id, "during-1", "two")
    assert [len(r.user_message.content) for r in all_records(stubs, run_id)] == [1, 1]


def test_concurrent_appends_under_a_held_lock_all_answer(
    grpc_server: RunningSidecar, stubs: Stubs, unique: Any
) -> None:
    """Every waiting append answers (stored or STORAGE_UNAVAILABLE), none INTERNAL."""
    run_id = new_run(stubs, unique("spec"))
    codes: list[grpc.StatusCode] = []

    def append(index: int) -> None:
        try:
            _append(stubs, run_id, f"c{index}", "x")
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as error:
            codes.append(error.code())

    with _lock_held(grpc_server, run_id):
        threads = [threading.Thread(target=append, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert len(codes) == 6
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    stored = all_records(stubs, run_id)
    assert len(stored) == codes.count(grpc.StatusCode.OK)


def test_postgresql_crashed_and_restarted_during_appends(tmp_path: Path) -> None:
    """A cluster of the test's own, durable (fsync, synchronous_commit, full_page_writes on),
    is crashed (`pg_ctl stop -m immediate`: no shutdown checkpoint) while a client appends,
    then started again (crash recovery): UNAVAILABLE / STORAGE_UNAVAILABLE during the
    outage, then appends succeed again without restarting the sidecar; every acknowledged
    record is stored once, sequences gap-free."""
    with own_cluster(durable=True) as cluster:
        engine = create_engine(cluster.url)
        with engine.connect() as connection:
            for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                assert connection.execute(text(f"SHOW {setting}")).scalar() == "on", setting
        engine.dispose()
        settings = flat_settings(
            listen=["127.0.0.1:0"],
            database_url=cluster.url,
            data_dir=tmp_path,
            shutdown_grace_seconds=5,
            secret_keys=TEST_SECRET_KEY,
            database_busy_timeout_seconds=BUSY_TIMEOUT,
            worker_threads=2,
        )
        with (
            RunningSidecar(settings) as running,
            running.stubs() as stubs,
        ):
            _appends_through_a_crash(stubs, cluster)


def _appends_through_a_crash(stubs: Stubs, cluster: Cluster) -> None:
    run_id = new_run(stubs, "crash-spec")
    acknowledged: dict[str, int] = {}
    outcomes: list[str] = []
    reasons: set[str] = set()
    stop = threading.Event()

    def append() -> None:
        number = 0
        while not stop.is_set():
            number += 1
            request_id = f"a{number}"
            while not stop.is_set():
                try:
                    answer = _append(stubs, run_id, request_id, request_id)
                except grpc.RpcError as error:
                    failure = rpc_status.from_call(error)
                    outcomes.append(f"{error.code().name}")
                    assert failure is not None, "an error without a google.rpc.Status"
                    if error.code() == grpc.StatusCode.UNAVAILABLE:
                        reasons.add(_reason(failure))
                    stop.wait(0.05)  # a pause before the retry, cut short by the end
                    continue  # retried with the same request id
                acknowledged[request_id] = answer.records[0].sequence
                outcomes.append("OK")
                break

    appender = threading.Thread(target=append)
    appender.start()
    try:
        wait_for(lambda: len(acknowledged) >= 5, "5 appends acknowledged", within=60)
        cluster.crash()
        try:
            wait_for(lambda: outcomes.count("UNAVAILABLE") >= 3, "3 appends refused", within=60)
        finally:
            cluster.start()
        recovered = len(acknowledged)
        wait_for(
            lambda: len(acknowledged) >= recovered + 5,
            "5 more appends acknowledged after the restart",
            within=60,
        )
    finally:
        stop.set()
        appender.join(60)
    assert reasons == {"STORAGE_UNAVAILABLE"}, reasons
    assert set(outcomes) <= {"OK", "UNAVAILABLE"}, set(outcomes)
    stored = all_records(stubs, run_id)
    assert [r.sequence for r in stored] == list(range(1, len(stored) + 1))
    texts = [r.user_message.content[0].text for r in stored]
    assert len(set(texts)) == len(texts)
    by_text = dict(zip(texts, (r.sequence for r in stored), strict=True))
    for request_id, sequence in acknowledged.items():
        assert by_text[request_id] == sequence


def _reason(status: Any) -> str:
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return ""

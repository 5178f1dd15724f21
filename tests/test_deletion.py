"""DeleteRun over the real server, on SQLite, PostgreSQL and PostgreSQL through PgBouncer: a
deleted Run is gone from every table and every RPC answers RUN_NOT_FOUND for it and its
handles; no other Run loses anything, also with appends racing the deletes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import grpc
import pytest
from sqlalchemy import Engine, func, select

from psych.sidecar.v1 import run_pb2, run_service_pb2, tool_service_pb2
from psych_sidecar.storage import tables
from psych_sidecar.storage.deletion import RUN_TABLES
from psych_sidecar.storage.engines import create_database_engine
from tests.support.databases import WITH_PGBOUNCER, pooling_of
from tests.support.requests import all_records, new_run, text_part, tool_result, user
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

# Deletion and the appends it races, through PgBouncer in transaction mode too.
SIDECAR_DATABASES = WITH_PGBOUNCER


@pytest.fixture(scope="module")
def engine(grpc_server: RunningSidecar) -> Iterator[Engine]:
    url = grpc_server.settings.resolved_database_url()
    created = create_database_engine(url, pool_size=2, pooling=pooling_of(url))
    yield created
    created.dispose()


def rows_of(engine: Engine, run_id: str) -> dict[str, int]:
    """How many rows each table holds for the Run."""
    counts = {}
    with engine.connect() as conn:
        for table in (*RUN_TABLES, tables.runs):
            query = select(func.count()).select_from(table).where(table.c.run_id == run_id)
            counts[table.name] = int(conn.execute(query).scalar_one())
    return counts


def _append(stubs: Stubs, run_id: str, *records: run_pb2.Record, request_id: str = "") -> str:
    """Append; the first record's handle (a tool result's)."""
    response = stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(
            run_id=run_id, request_id=request_id, records=list(records)
        )
    )
    return response.records[0].handle


def _delete(stubs: Stubs, run_id: str) -> None:
    stubs.runs.DeleteRun(run_service_pb2.DeleteRunRequest(run_id=run_id))


def _filled_run(stubs: Stubs, spec: str, tenant: str) -> tuple[str, str]:
    run_id = new_run(stubs, spec, tenant)
    _append(stubs, run_id, user("hello"), request_id="first")
    handle = _append(stubs, run_id, tool_result("c1", text_part("result " * 500)))
    return run_id, handle


def test_a_deleted_run_is_gone_everywhere_and_its_neighbours_untouched(
    stubs: Stubs, engine: Engine, unique: Callable[[str], str]
) -> None:
    tenant = unique("tenant")
    spec = unique("spec")
    doomed, doomed_handle = _filled_run(stubs, spec, tenant)
    kept, kept_handle = _filled_run(stubs, spec, tenant)
    # Read once, so this sidecar holds the Run in memory when it is deleted.
    stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=doomed))
    kept_before = all_records(stubs, kept)
    kept_rows = rows_of(engine, kept)

    _delete(stubs, doomed)

    assert set(rows_of(engine, doomed).values()) == {0}
    assert rows_of(engine, kept) == kept_rows
    assert all_records(stubs, kept) == kept_before
    read = tool_service_pb2.ReadToolOutputRequest
    assert stubs.tools.ReadToolOutput(read(run_id=kept, handle=kept_handle)).text
    for call in (
        lambda: stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=doomed)),
        lambda: all_records(stubs, doomed),
        lambda: _append(stubs, doomed, user("late")),
        lambda: stubs.tools.ReadToolOutput(read(run_id=doomed, handle=doomed_handle)),
        lambda: _delete(stubs, doomed),
    ):
        failure = rpc_failure(call)
        assert failure.code == grpc.StatusCode.NOT_FOUND
        assert failure.info.reason == "RUN_NOT_FOUND"
        assert failure.info.metadata["run_id"] == doomed


def test_delete_run_refuses_a_missing_id_and_an_unknown_run(stubs: Stubs) -> None:
    missing = rpc_failure(lambda: _delete(stubs, ""))
    assert (missing.code, missing.info.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_REQUIRED",
    )
    unknown = rpc_failure(lambda: _delete(stubs, "run_nosuchrun"))
    assert (unknown.code, unknown.info.reason) == (grpc.StatusCode.NOT_FOUND, "RUN_NOT_FOUND")


def test_concurrent_deletes_and_appends_keep_every_other_run_exact(
    stubs: Stubs, engine: Engine, unique: Callable[[str], str]
) -> None:
    tenant = unique("tenant")
    spec = unique("spec")
    runs = [new_run(stubs, spec, tenant) for _ in range(8)]
    doomed, kept = runs[::2], runs[1::2]
    appended = {run_id: 0 for run_id in runs}
    refused = {run_id: 0 for run_id in runs}
    codes: list[grpc.StatusCode] = []
    lock = threading.Lock()
    start = threading.Barrier(len(runs) + len(doomed))

    def append_to(run_id: str) -> None:
        start.wait()
        for index in range(15):
            try:
                _append(stubs, run_id, user(f"{run_id} {index}"), tool_result("c", text_part("x")))
            except grpc.RpcError as error:
                with lock:
                    refused[run_id] += 1
                    codes.append(error.code())
                continue
            with lock:
                appended[run_id] += 2

    def delete(run_id: str) -> None:
        start.wait()
        _delete(stubs, run_id)

    with ThreadPoolExecutor(len(runs) + len(doomed)) as pool:
        futures = [pool.submit(append_to, run_id) for run_id in runs]
        futures += [pool.submit(delete, run_id) for run_id in doomed]
        for future in futures:
            future.result()

    assert set(codes) <= {grpc.StatusCode.NOT_FOUND}
    for run_id in doomed:
        assert set(rows_of(engine, run_id).values()) == {0}
        # Once it was gone, every later append to it was refused: none came back.
        rpc_failure(partial(stubs.runs.GetRun, run_service_pb2.GetRunRequest(run_id=run_id)))
    for run_id in kept:
        assert refused[run_id] == 0
        records = all_records(stubs, run_id)
        assert len(records) == appended[run_id] == 30
        assert rows_of(engine, run_id)["records"] == 30
        texts = [r.user_message.content[0].text for r in records if r.HasField("user_message")]
        assert texts == [f"{run_id} {index}" for index in range(15)]

"""Deleting data outside DeleteRun, with real sidecar processes: `psych-sidecar prune` and a
serving sidecar's retention delete old Runs only and give the space back; `delete-tenant`
deletes a tenant's Runs, connections and secrets and nobody else's; on PostgreSQL one deleter
expires at a time; and a sidecar killed (SIGKILL) in the middle of a deletion leaves the Run
whole. On SQLite, PostgreSQL and PostgreSQL through PgBouncer."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Engine, func, select, text, update

from psych.sidecar.v1 import connection_service_pb2, run_service_pb2
from psych_sidecar.domain.runlog import ExpiryHeld
from psych_sidecar.storage import tables
from psych_sidecar.storage.deletion import RUN_TABLES, RunDeletions, database_bytes
from psych_sidecar.storage.engines import create_database_engine
from tests.support.connections import fixture_commands, put_stdio
from tests.support.databases import (
    POSTGRES_URL_ENV,
    TEST_SECRET_KEY,
    WITH_PGBOUNCER,
    database_of_kind,
    pooling_of,
)
from tests.support.polling import wait_for
from tests.support.processes import COMMAND, ServedSidecar
from tests.support.requests import all_records, new_run, text_part, tool_result, user
from tests.support.sidecar import UNLIMITED_CHANNEL, Stubs, rpc_failure

PAYLOAD = "".join(f"line {i}: {'x' * 90}\n" for i in range(2000))  # ~200 KB a result


@pytest.fixture(params=WITH_PGBOUNCER)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param != "sqlite" and not os.environ.get(POSTGRES_URL_ENV):
        pytest.skip("needs PostgreSQL (scripts/with-postgres)")
    with database_of_kind(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    created = create_database_engine(
        database_url, pool_size=2, busy_timeout_seconds=30, pooling=pooling_of(database_url)
    )
    yield created
    created.dispose()


class Sidecar:
    def __init__(self, database_url: str, socket: Path, **env: str) -> None:
        self.served = ServedSidecar(
            "--listen",
            f"unix://{socket}",
            "--database-url",
            database_url,
            env={"PSYCH_SIDECAR_DATABASE_POOLING": pooling_of(database_url), **env},
        )
        self.channel = grpc.insecure_channel(f"unix:{socket}", options=UNLIMITED_CHANNEL)
        self.stubs = Stubs.on(self.channel)
        self.served.wait_serving()

    def stop(self) -> None:
        self.channel.close()
        self.served.stop_cleanly()

    def kill(self) -> None:
        self.channel.close()
        self.served.kill()


def _cli(database_url: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PSYCH_SIDECAR_")}
    environment["PSYCH_SIDECAR_SECRET_KEYS"] = TEST_SECRET_KEY
    environment["PSYCH_SIDECAR_DATABASE_POOLING"] = pooling_of(database_url)
    return subprocess.run(
        [*COMMAND, *arguments, "--database-url", database_url],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _filled_run(stubs: Stubs, spec: str, tenant: str, results: int = 3) -> str:
    run_id = new_run(stubs, spec, tenant)
    stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user("hi")], request_id="r")
    )
    for index in range(results):
        stubs.runs.AppendRecords(
            run_service_pb2.AppendRecordsRequest(
                run_id=run_id, records=[tool_result(f"c{index}", text_part(PAYLOAD))]
            )
        )
    return run_id


def rows_of(engine: Engine, run_id: str) -> int:
    with engine.connect() as conn:
        return sum(
            int(
                conn.execute(
                    select(func.count()).select_from(table).where(table.c.run_id == run_id)
                ).scalar_one()
            )
            for table in (*RUN_TABLES, tables.runs)
        )


def _age(engine: Engine, run_ids: list[str], days: int) -> None:
    """Make Runs look created `days` earlier than they were."""
    runs = tables.runs
    with engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.run_id.in_(run_ids))
            .values(create_time_us=runs.c.create_time_us - days * 86_400_000_000)
        )


def _file_bytes(database_url: str) -> int:
    path = Path(database_url.removeprefix("sqlite:///"))
    return sum(f.stat().st_size for f in (path, Path(f"{path}-wal")) if f.exists())


def test_prune_deletes_the_old_runs_only_audits_them_and_gives_the_space_back(
    database_url: str, engine: Engine, tmp_path: Path
) -> None:
    sidecar = Sidecar(database_url, tmp_path / "s.sock")
    try:
        stubs = sidecar.stubs
        old = [_filled_run(stubs, "prune-spec", "acme") for _ in range(4)]
        new = [_filled_run(stubs, "prune-spec", "acme") for _ in range(2)]
        kept = {run_id: all_records(stubs, run_id) for run_id in new}
        _age(engine, old, days=40)
        before = _file_bytes(database_url) if database_url.startswith("sqlite") else 0

        # While the sidecar serves.
        done = _cli(database_url, "prune", "--older-than", "30d")

        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("pruned 4 runs created before "), done.stdout
        for run_id in old:
            assert rows_of(engine, run_id) == 0
            assert f"deleted run {run_id} of tenant acme (retention): 4 records" in done.stderr
            failure = rpc_failure(partial(all_records, stubs, run_id))
            assert failure.info.reason == "RUN_NOT_FOUND"
        assert "line 1" not in done.stderr
        for run_id, records in kept.items():
            assert all_records(stubs, run_id) == records
        if database_url.startswith("sqlite"):
            # Four Runs of ~600 KB each: VACUUM handed their pages back to the file system.
            after = _file_bytes(database_url)
            assert after < before - 4 * 500_000, (before, after)
    finally:
        sidecar.stop()


def test_postgresql_space_of_deleted_runs_is_reused_after_vacuum(
    database_url: str, engine: Engine, tmp_path: Path
) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite's file shrinking is the prune test's")
    sidecar = Sidecar(database_url, tmp_path / "s.sock")
    try:
        first = [_filled_run(sidecar.stubs, "space-spec", "acme") for _ in range(4)]
        grown = database_bytes(engine)
        _age(engine, first, days=40)
        assert _cli(database_url, "prune", "--older-than", "30d").returncode == 0
        # As much content again fits in the space VACUUM marked free: the database does not
        # grow by the ~2.4 MB it takes.
        for _ in range(4):
            _filled_run(sidecar.stubs, "space-spec", "acme")
        assert database_bytes(engine) < grown + 1_000_000, (grown, database_bytes(engine))
    finally:
        sidecar.stop()


def test_a_serving_sidecar_expires_runs_past_its_retention(
    database_url: str, engine: Engine, tmp_path: Path
) -> None:
    sidecar = Sidecar(database_url, tmp_path / "s.sock")
    old = [_filled_run(sidecar.stubs, "ret-spec", "acme", results=1) for _ in range(3)]
    young = _filled_run(sidecar.stubs, "ret-spec", "acme", results=1)
    sidecar.stop()
    _age(engine, old, days=2)

    retained = Sidecar(database_url, tmp_path / "r.sock", PSYCH_SIDECAR_RUN_RETENTION_HOURS="24")
    try:
        wait_for(
            lambda: all(rows_of(engine, run_id) == 0 for run_id in old),
            lambda: "the old Runs to be expired",
            within=30,
        )
        assert len(all_records(retained.stubs, young)) == 2
    finally:
        retained.stop()
    assert "run retention: deleted 3 runs created before" in retained.served.log


def test_one_deleter_expires_at_a_time_on_postgresql(database_url: str, engine: Engine) -> None:
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite's write transactions are one at a time already")
    from psych_sidecar.storage.migrate import migrate

    migrate(engine)
    deletions = RunDeletions(engine)
    later = datetime.now(UTC) + timedelta(days=1)
    with engine.connect() as holder, holder.begin():
        holder.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": 0x7073_6964_6578_7069})
        assert deletions.delete_expired_run(later) is ExpiryHeld.ELSEWHERE
    assert deletions.delete_expired_run(later) is None


def test_delete_tenant_removes_its_runs_connections_and_secrets_and_nobody_elses(
    database_url: str, engine: Engine, tmp_path: Path
) -> None:
    sidecar = Sidecar(
        database_url, tmp_path / "s.sock", PSYCH_SIDECAR_MCP_COMMANDS=json.dumps(fixture_commands())
    )
    try:
        stubs = sidecar.stubs
        for tenant in ("gone", "stays"):
            put_stdio(stubs, tenant, "tools", env={"FIXTURE_TOKEN": f"token-of-{tenant}"})
        gone = [_filled_run(stubs, "tenant-spec", "gone", results=1) for _ in range(2)]
        stays = _filled_run(stubs, "tenant-spec", "stays", results=1)
        # Its sessions end with the connection, as DeleteConnection's would.
        stubs.connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant="gone", name="tools")
        )

        done = _cli(database_url, "delete-tenant", "gone")

        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == (
            "deleted tenant gone: 2 runs, 1 connections, 0 oauth grants, 0 sign-ins"
        )
        assert all(rows_of(engine, run_id) == 0 for run_id in gone)
        with engine.connect() as conn:
            for table in (tables.connections, tables.catalog_versions, tables.catalog_tools):
                counts: dict[str, int] = dict(
                    conn.execute(
                        select(table.c.tenant, func.count()).group_by(table.c.tenant)
                    ).all()
                )
                assert "gone" not in counts, (table.name, counts)
                assert counts["stays"] >= 1, (table.name, counts)
        assert len(all_records(stubs, stays)) == 2
        refused = _cli(database_url, "delete-tenant", "not a tenant!")
        assert refused.returncode == 2
        assert "tenant" in refused.stderr
    finally:
        sidecar.stop()


def test_a_sidecar_killed_mid_deletion_leaves_the_run_whole(
    database_url: str, engine: Engine, tmp_path: Path
) -> None:
    sidecar = Sidecar(
        database_url, tmp_path / "s.sock", PSYCH_SIDECAR_DATABASE_BUSY_TIMEOUT_SECONDS="60"
    )
    run_id = _filled_run(sidecar.stubs, "kill-spec", "acme", results=30)
    before = all_records(sidecar.stubs, run_id)
    rows = rows_of(engine, run_id)
    postgres = not database_url.startswith("sqlite")
    holder = engine.connect()
    if postgres:
        # Hold a row the deletion reaches after it deleted the records and their parts: it
        # waits there, its deletes done but not committed, when the sidecar is killed.
        holder.begin()
        requests = tables.append_requests
        holder.execute(select(requests).where(requests.c.run_id == run_id).with_for_update())
    outcome: list[object] = []

    def delete() -> None:
        # Killed mid-call, or (SQLite) answered before the kill: either is an outcome.
        try:
            outcome.append(
                sidecar.stubs.runs.DeleteRun(run_service_pb2.DeleteRunRequest(run_id=run_id))
            )
        except grpc.RpcError as error:
            outcome.append(error.code())

    deleting = threading.Thread(target=delete, daemon=True)
    deleting.start()
    try:
        if postgres:
            wait_for(
                lambda: _waiting_delete(engine),
                lambda: "the deletion to wait for the held row",
                within=30,
            )
        else:
            # SQLite: the deletion writes zeroed pages into the write-ahead log as it goes.
            wal = Path(database_url.removeprefix("sqlite:///") + "-wal")
            start = wal.stat().st_size if wal.exists() else 0
            wait_for(
                lambda: (wal.stat().st_size if wal.exists() else 0) > start,
                lambda: "the deletion to start writing",
                within=30,
            )
        sidecar.kill()
    finally:
        holder.close()
    deleting.join(30)
    assert outcome
    if postgres:
        # No answer: the channel closed and the process died under the call.
        assert isinstance(outcome[0], grpc.StatusCode)

    after = rows_of(engine, run_id)
    # The kill landed mid-deletion on PostgreSQL (held there); on SQLite the deletion may
    # have committed before the kill: either way whole or gone, never partly.
    assert after in ((rows,) if postgres else (rows, 0))
    restarted = Sidecar(database_url, tmp_path / "r.sock")
    try:
        if after:
            assert all_records(restarted.stubs, run_id) == before
        else:
            failure = rpc_failure(lambda: all_records(restarted.stubs, run_id))
            assert failure.info.reason == "RUN_NOT_FOUND"
    finally:
        restarted.stop()


def _waiting_delete(engine: Engine) -> bool:
    with engine.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query ILIKE 'DELETE FROM append_requests%'"
            )
        ).scalar_one()
    return bool(waiting)

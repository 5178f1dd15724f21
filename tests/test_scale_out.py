"""Many sidecar processes, one PostgreSQL: Runs stay correct across all of them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import text

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    run_pb2,
    run_service_pb2,
    spec_pb2,
    spec_service_pb2,
    tool_service_pb2,
    turn_pb2,
    turn_service_pb2,
)
from psych_sidecar.storage.engines import create_database_engine
from tests.support.connections import fixture_http
from tests.support.databases import (
    HEAD_REVISION,
    database_of_kind,
    pgbouncer_url,
    pooling_of,
    postgres_database,
)
from tests.support.processes import ServedSidecar, free_port, running
from tests.support.requests import text_part, tool_result, user
from tests.support.sidecar import UNLIMITED_CHANNEL, Stubs

SIDECARS = 3


class SidecarProcess:
    """A `psych-sidecar serve` process on a Unix socket, and stubs on a channel to it."""

    def __init__(self, socket_path: Path, database_url: str, **env: str) -> None:
        self.database_url = database_url
        self.served = ServedSidecar(
            "--listen",
            f"unix://{socket_path}",
            "--database-url",
            database_url,
            env={"PSYCH_SIDECAR_DATABASE_POOLING": pooling_of(database_url), **env},
        )
        self.channel = grpc.insecure_channel(f"unix:{socket_path}", options=UNLIMITED_CHANNEL)
        stubs = Stubs.on(self.channel)
        self.runs = stubs.runs
        self.specs = stubs.specs
        self.connections = stubs.connections
        self.tools = stubs.tools
        self.turns = stubs.turns

    def stop(self) -> None:
        self.channel.close()
        self.served.stop_cleanly()


@pytest.fixture(scope="module", params=["postgresql", "pgbouncer"])
def sidecars(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[SidecarProcess]]:
    """Several sidecar processes started at once on one new PostgreSQL database (directly, and
    through PgBouncer in transaction mode), so their migrations race each other as they would
    in a rolling deployment."""
    with database_of_kind(request.param, tmp_path_factory.mktemp("unused")) as url:
        directory = tmp_path_factory.mktemp("scale")
        started = [SidecarProcess(directory / f"s{i}.sock", url) for i in range(SIDECARS)]
        try:
            for sidecar in started:
                sidecar.served.wait_serving()
            yield started
        finally:
            for sidecar in started:
                sidecar.stop()


def _new_run(sidecar: SidecarProcess, name: str, tenant: str = "t") -> str:
    grants = [spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")]
    sidecar.specs.PublishSpec(
        spec_service_pb2.PublishSpecRequest(spec=spec_pb2.Spec(name=name, version=1, grants=grants))
    )
    request = run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=name, spec_version=1)
    return sidecar.runs.CreateRun(request).run.run_id


def _list(sidecar: SidecarProcess, run_id: str) -> list[run_pb2.Record]:
    records: list[run_pb2.Record] = []
    token = ""
    while True:
        page = sidecar.runs.ListRecords(
            run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=97, page_token=token)
        )
        records.extend(page.records)
        token = page.next_page_token
        if not token:
            return records


def test_sidecars_started_together_on_an_empty_database_all_migrate_and_serve(
    sidecars: list[SidecarProcess],
) -> None:
    # The fixture started every sidecar at once on a new database and waited for SERVING,
    # which each reports only after its migrations: all of them got there, on one schema.
    url = sidecars[0].database_url
    engine = create_database_engine(url, pool_size=1, pooling=pooling_of(url))
    try:
        with engine.connect() as connection:
            versions = connection.execute(text("SELECT version_num FROM alembic_version")).all()
        assert [row.version_num for row in versions] == [HEAD_REVISION]
    finally:
        engine.dispose()


def test_concurrent_appends_across_sidecars_store_each_record_exactly_once(
    sidecars: list[SidecarProcess],
) -> None:
    run_id = _new_run(sidecars[0], "appends")
    requests = [
        run_service_pb2.AppendRecordsRequest(
            run_id=run_id,
            request_id=f"req-{index}",
            records=[user(f"q{index}"), tool_result(f"c{index}", text_part(f"r{index}"))],
        )
        for index in range(120)
    ]
    answers: dict[str, list[tuple[int, str]]] = {}
    lock = threading.Lock()

    def send(index: int) -> None:
        request = requests[index]
        # Every request goes to one sidecar, and its retry (as after a lost response) to
        # another, concurrently with everything else.
        first = sidecars[index % SIDECARS].runs.AppendRecords(request)
        retry = sidecars[(index + 1) % SIDECARS].runs.AppendRecords(request)
        assert retry == first
        with lock:
            answers[request.request_id] = [(r.sequence, r.handle) for r in first.records]

    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(send, range(len(requests))))

    stored = _list(sidecars[1], run_id)
    assert [r.sequence for r in stored] == list(range(1, 2 * len(requests) + 1))
    by_sequence = {r.sequence: r for r in stored}
    for index, request in enumerate(requests):
        (question_seq, _), (result_seq, handle) = answers[request.request_id]
        assert result_seq == question_seq + 1  # an append's records are adjacent
        assert by_sequence[question_seq].user_message.content[0].text == f"q{index}"
        assert by_sequence[result_seq].tool_result.content[0].text == f"r{index}"
        assert by_sequence[result_seq].handle == handle


def test_a_run_created_on_one_sidecar_continues_on_another_with_identical_bytes(
    sidecars: list[SidecarProcess],
) -> None:
    run_id = _new_run(sidecars[0], "handover")
    sidecars[1].runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(
            run_id=run_id,
            records=[user("hello"), tool_result("c1", text_part("x" * 100_000 + "\x00é"))],
        )
    )
    sidecars[2].runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user("again")])
    )
    views = [_list(sidecar, run_id) for sidecar in sidecars]
    serialized = [[r.SerializeToString(deterministic=True) for r in view] for view in views]
    assert serialized[0] == serialized[1] == serialized[2]
    assert len(views[0]) == 3
    handle = views[0][1].handle

    # The prompt and the reads are the same bytes whichever sidecar assembles them.
    now = Timestamp(seconds=1_800_000_000)
    prompts = [
        sidecar.turns.AssemblePrompt(
            turn_service_pb2.AssemblePromptRequest(run_id=run_id, now=now, model="m")
        )
        for sidecar in sidecars
    ]
    assert prompts[0].anthropic_request_json
    assert len({p.SerializeToString(deterministic=True) for p in prompts}) == 1
    reads = [
        sidecar.tools.ReadToolOutput(
            tool_service_pb2.ReadToolOutputRequest(
                run_id=run_id, handle=handle, offset=99_990, limit=100
            )
        )
        for sidecar in sidecars
    ]
    assert reads[0].text == "x" * 10 + "\x00é"
    assert len({r.SerializeToString(deterministic=True) for r in reads}) == 1
    got = sidecars[2].runs.GetRun(run_service_pb2.GetRunRequest(run_id=run_id)).run
    assert got.run_id == run_id


def _catalog(
    sidecar: SidecarProcess, tenant: str, version: int = 0
) -> list[connection_pb2.CatalogTool]:
    return list(
        sidecar.connections.ListCatalogTools(
            connection_service_pb2.ListCatalogToolsRequest(
                tenant=tenant, name="fx", catalog_version=version, page_size=1000
            )
        ).tools
    )


def test_concurrent_catalogue_refreshes_across_sidecars_stay_consistent(
    sidecars: list[SidecarProcess],
) -> None:
    tenant = "catalog"
    port = free_port()
    with running(fixture_http(port, "--tools", "40", "--page-size", "7")):
        connection = connection_pb2.Connection(
            tenant=tenant,
            name="fx",
            http=connection_pb2.HttpTransport(
                url=f"http://127.0.0.1:{port}/mcp",
                protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
            ),
        )
        sidecars[0].connections.PutConnection(
            connection_service_pb2.PutConnectionRequest(connection=connection)
        )
        run_id = _new_run(sidecars[0], "catalog", tenant)
        added = [f"added_{index}" for index in range(12)]
        stop = threading.Event()
        torn_reads: list[str] = []

        def read_current() -> None:
            # A reader must only ever see one whole version: every current row carries the
            # version that wrote it, and that version reads back as exactly the same set.
            while not stop.is_set():
                current = _catalog(sidecars[2], tenant)
                versions = {tool.catalog_version for tool in current}
                if len(versions) != 1:
                    torn_reads.append(f"current rows of versions {sorted(versions)}")
                    continue
                (version,) = versions
                names = sorted(tool.name for tool in current)
                if sorted(t.name for t in _catalog(sidecars[2], tenant, version)) != names:
                    torn_reads.append(f"current differs from version {version}")

        def refresh(index: int) -> None:
            for _ in range(15):
                sidecars[index % 2].connections.RefreshCatalog(
                    connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="fx")
                )

        def add_tools() -> None:
            # Changes the server's listing under the refreshes (silently: no list_changed).
            for name in added:
                arguments = Struct()
                arguments.update({"name": name, "notify": False})
                outcome = (
                    sidecars[0]
                    .tools.CallDeferredTool(
                        tool_service_pb2.CallDeferredToolRequest(
                            run_id=run_id,
                            server="fx",
                            tool="add_tool",
                            arguments=arguments,
                            call_id=f"call-{name}",
                        )
                    )
                    .outcome
                )
                assert not outcome.is_error, outcome.result_json

        reader = threading.Thread(target=read_current)
        reader.start()
        try:
            with ThreadPoolExecutor(max_workers=5) as pool:
                futures = [pool.submit(refresh, index) for index in range(4)]
                futures.append(pool.submit(add_tools))
                for future in futures:
                    future.result()
            sidecars[1].connections.RefreshCatalog(
                connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="fx")
            )
        finally:
            # Stopped on failure too, or it would fail the next test's teardown.
            stop.set()
            reader.join()

    assert torn_reads == []
    newest = max(tool.catalog_version for tool in _catalog(sidecars[0], tenant))
    # Versions are 1..newest with none missing, each written once (strictly increasing).
    for version in range(1, newest + 1):
        assert _catalog(sidecars[1], tenant, version), f"version {version} is missing"
    # Marking older rows removed never removed a tool the newest version saw: the current
    # catalogue is exactly the newest version, and it has every tool the server now lists.
    current = sorted(tool.name for tool in _catalog(sidecars[0], tenant))
    assert current == sorted(tool.name for tool in _catalog(sidecars[0], tenant, newest))
    assert set(added) <= set(current)
    assert {tool.removed_in_version for tool in _catalog(sidecars[0], tenant)} == {0}


def test_a_turns_surface_is_pinned_for_every_sidecar(sidecars: list[SidecarProcess]) -> None:
    tenant = "pinned"
    run_id = _new_run(sidecars[0], "pinned", tenant)
    sidecars[0].runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user("first")])
    )

    def surface(sidecar: SidecarProcess) -> turn_pb2.ToolSurface:
        request = turn_service_pb2.ResolveTurnRequest(run_id=run_id)
        return sidecar.turns.ResolveTurn(request).surface

    first = surface(sidecars[0])
    assert list(first.servers) == []
    # A server connected mid-turn through another sidecar (unreachable: it still has a line).
    connection = connection_pb2.Connection(
        tenant=tenant,
        name="late",
        http=connection_pb2.HttpTransport(
            url=f"http://127.0.0.1:{free_port()}/mcp",
            protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
        ),
    )
    sidecars[1].connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    )
    # Every sidecar serves the turn's pinned surface, also one that never resolved it before.
    for sidecar in sidecars:
        assert surface(sidecar) == first
    sidecars[2].runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user("second")])
    )
    nxt = [surface(sidecar) for sidecar in reversed(sidecars)]
    assert [line.server for line in nxt[0].servers] == ["late"]
    assert nxt[0] == nxt[1] == nxt[2]


def test_a_sidecar_behind_pgbouncer_migrates_on_the_servers_own_url(tmp_path: Path) -> None:
    """migration_database_url: the schema is made on PostgreSQL's own address, then the
    sidecar serves through PgBouncer in transaction mode."""
    with postgres_database() as direct:
        bouncer = f"{pgbouncer_url().rpartition('/')[0]}/{direct.rpartition('/')[2]}"
        sidecar = SidecarProcess(
            tmp_path / "s.sock", bouncer, PSYCH_SIDECAR_MIGRATION_DATABASE_URL=direct
        )
        try:
            sidecar.served.wait_serving()
            run_id = _new_run(sidecar, "migrated-apart")
            assert _list(sidecar, run_id) == []
            assert "applied schema migration" in sidecar.served.log
        finally:
            sidecar.stop()
        engine = create_database_engine(direct, pool_size=1)
        try:
            with engine.connect() as connection:
                version = connection.execute(text("SELECT version_num FROM alembic_version"))
                assert version.scalar_one() == HEAD_REVISION
        finally:
            engine.dispose()

"""The assembly journal over the real server, on both databases: one row of metadata per
AssemblePrompt, nothing of the transient message or the dynamic tail stored anywhere, and
rows older than the retention deleted."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, MetaData, create_engine, select, text

from psych.sidecar.v1 import run_pb2, spec_pb2, turn_pb2
from psych_sidecar.domain.prompt import (
    AssemblyEntry,
    ElisionRule,
    SurfaceServer,
    Zone,
    ZoneSize,
)
from psych_sidecar.domain.run_inspector import MissCause, explain_miss
from psych_sidecar.storage.engines import normalize_url
from psych_sidecar.storage.journal import SqlAssemblyJournal
from tests.support.prompts import append, assemble, assistant, result, run_with, thresholds
from tests.support.requests import text_part, user
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar, Stubs

ZONES = {
    turn_pb2.PROMPT_ZONE_STATIC_SYSTEM: Zone.STATIC_SYSTEM,
    turn_pb2.PROMPT_ZONE_DYNAMIC_TAIL: Zone.DYNAMIC_TAIL,
    turn_pb2.PROMPT_ZONE_HISTORY: Zone.HISTORY,
    turn_pb2.PROMPT_ZONE_TRANSIENT: Zone.TRANSIENT,
}


# One transport is enough here: the journal sits behind the servicer, not the socket.
SIDECAR_TRANSPORTS = ["unix"]


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[Engine]:
    """A second engine on the sidecar's database, for looking at what it stored."""
    engine = create_engine(normalize_url(database_url))
    yield engine
    engine.dispose()


def entries(grpc_server: RunningSidecar, run_id: str) -> list[AssemblyEntry]:
    journal = grpc_server.sidecar.journal
    assert journal is not None, "the journal is on by default"
    return journal.entries(run_id, 1000)


def test_every_assemble_prompt_writes_one_row_of_its_zones_turn_and_step(
    stubs: Stubs, grpc_server: RunningSidecar, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), instructions="Be brief.")
    append(stubs, run_id, user("hello"))
    first = assemble(stubs, run_id, model="model-a")
    append(stubs, run_id, assistant("", ("c1", "host_tool", "{}")), result("c1", "done"))
    second = assemble(stubs, run_id, model="model-a")
    append(stubs, run_id, assistant("ok"), user("again"))
    third = assemble(stubs, run_id, model="model-b")

    rows = entries(grpc_server, run_id)
    assert [(r.turn, r.step, r.model) for r in rows] == [
        (1, 0, "model-a"),
        (1, 1, "model-a"),
        (2, 0, "model-b"),
    ]
    assert [r.last_sequence for r in rows] == [1, 3, 5]
    for row, response in zip(rows, (first, second, third), strict=True):
        assert row.run_id == run_id
        assert row.spec_version == 1
        assert row.context_guard is None
        assert [(z.zone, z.byte_length, z.sha256) for z in row.zones] == [
            (ZONES[d.zone], d.byte_length, d.sha256) for d in response.zones
        ]
        assert all(z.estimated_tokens == -(-z.byte_length // 4) for z in row.zones)
        assert row.tool_count == len(response.prompt.tools.tools)


def test_elided_results_are_journalled_with_their_handle_and_rule(
    stubs: Stubs, grpc_server: RunningSidecar, unique: Callable[[str], str]
) -> None:
    run_id = run_with(
        stubs,
        unique("agent"),
        thresholds=thresholds(
            per_result_tokens=400,
            per_batch_tokens=500,
            preview_head_chars=100,
            preview_tail_chars=50,
        ),
    )
    calls = [("big", "host_tool", "{}"), ("m1", "host_tool", "{}"), ("m2", "host_tool", "{}")]
    appended = append(
        stubs,
        run_id,
        user("go"),
        assistant("", *calls),
        result("big", "x" * 2000),  # over the per-result threshold on its own: step 2
        result("m1", "y" * 1200),  # under it, but the batch is over budget: step 3
        result("m2", "z" * 1100),
        user("next"),
    )
    assemble(stubs, run_id)
    (row,) = entries(grpc_server, run_id)
    handles = {a.sequence: a.handle for a in appended}
    assert [(e.sequence, e.handle, e.rule) for e in row.elided] == [
        (3, handles[3], ElisionRule.PER_RESULT),
        (4, handles[4], ElisionRule.PER_BATCH),
    ]
    assert (row.turn, row.step) == (2, 0)


def test_nothing_of_the_transient_message_or_the_tail_is_stored_in_any_table(
    stubs: Stubs, grpc_server: RunningSidecar, engine: Engine, unique: Callable[[str], str]
) -> None:
    note = f"transient-{uuid.uuid4().hex}"
    tail = f"memory-{uuid.uuid4().hex}"
    run_id = run_with(stubs, unique("agent"))
    append(stubs, run_id, user("hello"))
    response = assemble(stubs, run_id, transient_note=note, dynamic_tail=tail)
    assert note.encode() in response.anthropic_request_json
    assert len(entries(grpc_server, run_id)) == 1

    metadata = MetaData()
    metadata.reflect(engine)
    assert "assembly_journal" in metadata.tables
    with engine.connect() as conn:
        for table in metadata.tables.values():
            for row in conn.execute(select(table)):
                for value in row:
                    stored = value if isinstance(value, bytes) else str(value).encode()
                    for secret in (note, tail, "Current date and time"):
                        assert secret.encode() not in stored, (table.name, secret)


def test_the_journal_can_be_turned_off(tmp_path: Path) -> None:
    settings = flat_settings(
        listen=[f"unix://{tmp_path / 's.sock'}"],
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        data_dir=tmp_path,
        assembly_journal=False,
    )
    with RunningSidecar(settings) as running:
        assert running.sidecar.journal is None
        with running.stubs() as stubs:
            run_id = run_with(stubs, "agent")
            append(stubs, run_id, user("hello"))
            assemble(stubs, run_id)
        engine = create_engine(normalize_url(settings.storage.database_url))
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT count(*) FROM assembly_journal")).scalar()
        engine.dispose()
    assert rows == 0


def test_a_journal_that_cannot_write_does_not_fail_the_prompt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = flat_settings(
        listen=[f"unix://{tmp_path / 's.sock'}"],
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        data_dir=tmp_path,
    )
    with RunningSidecar(settings) as running:
        engine = create_engine(normalize_url(settings.storage.database_url))
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE assembly_journal"))
        engine.dispose()
        with running.stubs() as stubs:
            run_id = run_with(stubs, "agent")
            append(stubs, run_id, user("hello"))
            with caplog.at_level(logging.WARNING, logger="psych_sidecar.storage.journal"):
                response = assemble(stubs, run_id)
    assert len(response.zones) == 4
    assert f"could not record a prompt of run {run_id}" in caplog.text


def _entry(run_id: str) -> AssemblyEntry:
    return AssemblyEntry(
        run_id=run_id,
        time=datetime.now(UTC),
        model="m",
        spec_name="s",
        spec_version=1,
        turn=1,
        step=0,
        last_sequence=1,
        zones=tuple(ZoneSize(zone, 4, 1, "0" * 64) for zone in Zone),
        tool_count=1,
        servers=(SurfaceServer("docs", "connected", "deferred", 3, 12),),
        elided=(),
    )


def test_rows_older_than_the_retention_are_deleted(
    stubs: Stubs, engine: Engine, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    clock = [1_000_000_000_000]
    journal = SqlAssemblyJournal(
        engine, retention_seconds=60, prune_interval_seconds=0, clock=lambda: clock[0]
    )
    journal.record(_entry(run_id))
    clock[0] += 30_000_000
    journal.record(_entry(run_id))
    assert len(journal.entries(run_id, 10)) == 2
    assert journal.entries(run_id, 10)[1].servers == (
        SurfaceServer("docs", "connected", "deferred", 3, 12),
    )
    clock[0] += 31_000_000  # the first row is now 61 s old, the second 31 s
    journal.record(_entry(run_id))
    kept = journal.entries(run_id, 10)
    assert [int(e.time.timestamp()) for e in kept] == [1_000_030, 1_000_061]
    assert len(journal.entries(run_id, 1)) == 1


def test_pruning_runs_at_most_once_per_interval(
    stubs: Stubs, engine: Engine, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    clock = [2_000_000_000_000]
    journal = SqlAssemblyJournal(
        engine, retention_seconds=1, prune_interval_seconds=10, clock=lambda: clock[0]
    )
    journal.record(_entry(run_id))  # prunes (first write), nothing old yet
    clock[0] += 5_000_000
    journal.record(_entry(run_id))  # within the interval: no prune
    assert len(journal.entries(run_id, 10)) == 2
    clock[0] += 6_000_000
    journal.record(_entry(run_id))  # prunes: only this one is within 1 s
    assert len(journal.entries(run_id, 10)) == 1


def test_a_compaction_is_journalled_and_named_as_the_miss_it_makes(
    stubs: Stubs, grpc_server: RunningSidecar, unique: Callable[[str], str]
) -> None:
    policy = spec_pb2.CompactionPolicy(trigger_tokens=1_000, keep_recent_turns=0)
    run_id = run_with(stubs, unique("agent"), compaction=policy)
    for number in range(3):
        append(stubs, run_id, user(f"question {number} " + "q" * 2_000))
        append(stubs, run_id, assistant(f"answer {number} " + "a" * 2_000))
    append(stubs, run_id, user("and now?"))
    proposal = assemble(stubs, run_id).compaction
    assert (proposal.first_sequence, proposal.last_sequence) == (1, 6)
    summary = run_pb2.Compaction(
        summary=[text_part("three questions")], first_sequence=1, last_sequence=6
    )
    append(stubs, run_id, run_pb2.Record(compaction=summary))
    assemble(stubs, run_id)
    before, after = entries(grpc_server, run_id)[-2:]
    assert (before.compacted_through, after.compacted_through) == (0, 6)
    miss = explain_miss(before, after)
    assert miss is not None
    assert [r.cause for r in miss.reasons] == [MissCause.COMPACTION]

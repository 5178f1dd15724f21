"""`psych-sidecar inspect` against the real server: each view prints what the gRPC reads
answer, as JSON and as a table."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import struct_pb2

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    content_pb2,
    run_pb2,
    run_service_pb2,
    spec_pb2,
    tool_service_pb2,
    turn_pb2,
    turn_service_pb2,
)
from psych_sidecar import cli
from psych_sidecar.inspect_command.remote import content_bytes
from psych_sidecar.inspect_command.views import timestamp
from tests.support.connections import fixture_commands
from tests.support.prompts import append, assistant, history_results, run_with, thresholds
from tests.support.requests import user
from tests.support.sidecar import RunningSidecar, Stubs

TENANT = "inspect-tenant"


# The fixture MCP server as an allowed stdio command; no search vectors, whose background
# warm-up would write while a test compares the database before and after.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": fixture_commands(),
    "semantic_search": "off",
}


# One transport is enough: inspect is a client like any other.
SIDECAR_TRANSPORTS = ["unix"]


@pytest.fixture(scope="module")
def scripted(stubs: Stubs) -> dict[str, str]:
    """Two Runs; the second with a deferred call whose big result is elided next turn; a
    connection whose catalogue has two versions."""
    connection = connection_pb2.Connection(
        tenant=TENANT, name="fx", stdio=connection_pb2.StdioTransport(command="fixture")
    )
    stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    )
    grants = [spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")]
    spec = thresholds(per_result_tokens=1000)
    first = run_with(stubs, "inspect-a", tenant=TENANT, grants=grants, thresholds=spec)
    run_id = run_with(stubs, "inspect-b", tenant=TENANT, grants=grants, thresholds=spec)
    append(stubs, run_id, user("fetch"), assistant("", ("c1", "fx__huge_text", "{}")))
    arguments = struct_pb2.Struct()
    arguments.update({"size": 40_000})
    stubs.tools.CallDeferredTool(
        tool_service_pb2.CallDeferredToolRequest(
            run_id=run_id, server="fx", tool="huge_text", arguments=arguments, call_id="c1"
        )
    )
    added = struct_pb2.Struct()
    added.update({"name": "added_tool", "notify": False})
    stubs.tools.CallDeferredTool(
        tool_service_pb2.CallDeferredToolRequest(
            run_id=run_id, server="fx", tool="add_tool", arguments=added, call_id="c2"
        )
    )
    stubs.connections.RefreshCatalog(
        connection_service_pb2.RefreshCatalogRequest(tenant=TENANT, name="fx")
    )
    append(stubs, run_id, user("look closer"))
    # A compacted Run, another tenant's (the Runs list above stays two): turns 1-2 and then
    # turn 3 summarised.
    policy = spec_pb2.CompactionPolicy(trigger_tokens=100_000, keep_recent_turns=1)
    compacted = run_with(stubs, "inspect-compacted", tenant="inspect-compacted", compaction=policy)
    for turn in range(1, 5):
        append(stubs, compacted, user(f"Question {turn}."), assistant(f"Answer {turn}."))
    append(stubs, compacted, user("Question 5."))
    append(stubs, compacted, _compaction("S" * 1_500, 1, 4))
    append(stubs, compacted, _compaction("T" * 700, 5, 6))
    return {"first": first, "run": run_id, "compacted": compacted}


def _compaction(summary: str, first: int, last: int) -> run_pb2.Record:
    return run_pb2.Record(
        compaction=run_pb2.Compaction(
            summary=[content_pb2.ContentPart(text=summary)],
            first_sequence=first,
            last_sequence=last,
        )
    )


def inspect(
    grpc_server: RunningSidecar, capsys: pytest.CaptureFixture[str], *arguments: str
) -> tuple[int, str]:
    code = cli.main(["inspect", *arguments, "--address", grpc_server.sidecar.bound[0]])
    return code, capsys.readouterr().out


def as_json(
    grpc_server: RunningSidecar, capsys: pytest.CaptureFixture[str], *arguments: str
) -> Any:
    code, out = inspect(grpc_server, capsys, *arguments, "--json")
    assert code == 0
    return json.loads(out)


def test_runs_lists_the_tenants_runs_newest_first(
    grpc_server: RunningSidecar, stubs: Stubs, scripted: dict[str, str], capsys: Any
) -> None:
    data = as_json(grpc_server, capsys, "runs", TENANT)
    answer = stubs.runs.ListRuns(run_service_pb2.ListRunsRequest(tenant=TENANT))
    assert [row["run_id"] for row in data["runs"]] == [run.run_id for run in answer.runs]
    assert [row["run_id"] for row in data["runs"]] == [scripted["run"], scripted["first"]]
    assert data["runs"][0]["spec"] == "inspect-b@1"
    code, table = inspect(grpc_server, capsys, "runs", TENANT)
    assert code == 0
    assert table.splitlines()[0].split() == ["run_id", "spec", "created"]
    assert scripted["run"] in table.splitlines()[1]
    code, table = inspect(grpc_server, capsys, "runs", TENANT, "--limit", "1")
    assert "more than 1" in table


def test_log_summarises_records_tool_results_and_what_is_elided(
    grpc_server: RunningSidecar, stubs: Stubs, scripted: dict[str, str], capsys: Any
) -> None:
    run_id = scripted["run"]
    data = as_json(grpc_server, capsys, "log", run_id)
    records = stubs.runs.ListRecords(run_service_pb2.ListRecordsRequest(run_id=run_id)).records
    results = [r for r in records if r.WhichOneof("kind") == "tool_result"]
    assert data["records"] == len(records)
    assert data["records_by_kind"] == {
        "ASSISTANT_MESSAGE": 1,
        "TOOL_RESULT": 2,
        "USER_MESSAGE": 2,
    }
    prompt = stubs.turns.AssemblePrompt(turn_service_pb2.AssemblePromptRequest(run_id=run_id))
    elided = history_results(prompt)
    assert [
        (row["sequence"], row["handle"], row["bytes"], row["elided_now"])
        for row in data["tool_results"]
    ] == [
        (
            r.sequence,
            r.handle,
            content_bytes(r.tool_result.content),
            elided[r.tool_result.call_id].elided,
        )
        for r in results
    ]
    assert data["tool_results"][0]["bytes"] == 40_000
    assert data["elided_now"] == 1
    code, table = inspect(grpc_server, capsys, "log", run_id)
    assert code == 0
    assert results[0].handle in table


def test_log_lists_each_compaction_with_what_it_covered(
    grpc_server: RunningSidecar, stubs: Stubs, scripted: dict[str, str], capsys: Any
) -> None:
    run_id = scripted["compacted"]
    data = as_json(grpc_server, capsys, "log", run_id)
    stored = stubs.runs.ListRecords(
        run_service_pb2.ListRecordsRequest(run_id=run_id, kinds=[run_pb2.RECORD_KIND_COMPACTION])
    ).records
    assert [
        {key: row[key] for key in ("sequence", "records", "turns", "summary_chars")}
        for row in data["compactions"]
    ] == [
        {"sequence": 10, "records": "1-4", "turns": "1-2", "summary_chars": 1_500},
        {"sequence": 11, "records": "5-6", "turns": "3-3", "summary_chars": 700},
    ]
    assert [row["created"] for row in data["compactions"]] == [
        timestamp(r.create_time.ToDatetime(tzinfo=UTC)) for r in stored
    ]
    assert data["records_by_kind"]["COMPACTION"] == 2
    code, table = inspect(grpc_server, capsys, "log", run_id)
    assert code == 0
    header = "sequence created records turns summary_chars"
    assert header in [" ".join(line.split()) for line in table.splitlines()]
    assert ["10", data["compactions"][0]["created"], "1-4", "1-2", "1500"] in [
        line.split() for line in table.splitlines()
    ]
    # A Run without one prints no compaction table, and its JSON an empty list.
    assert as_json(grpc_server, capsys, "log", scripted["run"])["compactions"] == []
    assert "summary_chars" not in inspect(grpc_server, capsys, "log", scripted["run"])[1]


def test_prompt_shows_zone_sizes_and_hashes(
    grpc_server: RunningSidecar, stubs: Stubs, scripted: dict[str, str], capsys: Any
) -> None:
    # One clock for both: the transient zone names the time, which may cross a boundary
    # between two calls that each read their own clock.
    at = "2026-06-01T12:00:00Z"
    data = as_json(grpc_server, capsys, "prompt", scripted["run"], "--now", at)
    request = turn_service_pb2.AssemblePromptRequest(run_id=scripted["run"])
    request.now.FromJsonString(at)
    prompt = stubs.turns.AssemblePrompt(request)
    assert [(z["bytes"], z["sha256"]) for z in data["zones"]] == [
        (z.byte_length, z.sha256) for z in prompt.zones
    ]
    assert [z["zone"] for z in data["zones"]] == [
        turn_pb2.PromptZone.Name(z.zone).removeprefix("PROMPT_ZONE_").lower() for z in prompt.zones
    ]
    assert data["requests"]["anthropic"]["bytes"] == len(prompt.anthropic_request_json)
    assert data["requests"]["gemini"]["bytes"] == len(prompt.gemini_request_json)
    assert data["requests"]["openai_responses"]["bytes"] == len(
        prompt.openai_responses_request_json
    )
    code, table = inspect(grpc_server, capsys, "prompt", scripted["run"], "--now", at)
    assert code == 0
    assert prompt.zones[0].sha256 in table


def test_catalog_lists_versions_and_diffs_two(
    grpc_server: RunningSidecar, stubs: Stubs, scripted: dict[str, str], capsys: Any
) -> None:
    data = as_json(grpc_server, capsys, "catalog", TENANT, "fx")
    answer = stubs.connections.ListCatalogVersions(
        connection_service_pb2.ListCatalogVersionsRequest(tenant=TENANT, name="fx")
    )
    assert [(v["version"], v["tools"], v["sha256"]) for v in data["versions"]] == [
        (v.catalog_version, v.tool_count, v.sha256) for v in answer.versions
    ]
    assert [v["version"] for v in data["versions"]] == [2, 1]
    diff = as_json(grpc_server, capsys, "catalog", TENANT, "fx", "--diff", "1", "2")
    assert diff["changes"] == [{"change": "added", "tool": "added_tool", "version": 2}]
    code, table = inspect(grpc_server, capsys, "catalog", TENANT, "fx", "--diff", "1", "0")
    assert code == 0
    assert "added_tool" in table


def test_connections_shows_states(
    grpc_server: RunningSidecar, stubs: Stubs, scripted: dict[str, str], capsys: Any
) -> None:
    data = as_json(grpc_server, capsys, "connections", TENANT)
    answer = stubs.connections.ListConnections(
        connection_service_pb2.ListConnectionsRequest(tenant=TENANT)
    )
    assert [(c["name"], c["state"], c["catalog_version"]) for c in data["connections"]] == [
        (
            c.name,
            connection_pb2.ConnectionState.Name(c.state).removeprefix("CONNECTION_STATE_"),
            c.catalog_version,
        )
        for c in answer.connections
    ]
    assert data["connections"][0]["state"] == "CONNECTED"
    code, table = inspect(grpc_server, capsys, "connections", TENANT)
    assert code == 0
    assert "CONNECTED" in table


def test_a_refused_read_is_reported_and_exits_1(
    grpc_server: RunningSidecar, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["inspect", "log", "run_unknown", "--address", grpc_server.sidecar.bound[0]])
    captured = capsys.readouterr()
    assert code == 1
    assert "NOT_FOUND" in captured.err
    assert captured.out == ""


def test_inspect_previews_leave_no_journal_row(
    grpc_server: RunningSidecar, stubs: Stubs, scripted: dict[str, str], capsys: Any
) -> None:
    """The views that assemble the prompt do it as a preview: the Run inspector's timeline
    (the assembly journal) shows only the host's model calls."""
    journal = grpc_server.sidecar.journal
    assert journal is not None
    run_id = scripted["run"]
    before = len(journal.entries(run_id, 1000))
    for view in ("log", "prompt"):
        assert inspect(grpc_server, capsys, view, run_id)[0] == 0
    assert len(journal.entries(run_id, 1000)) == before
    # A host's AssemblePrompt is journaled.
    stubs.turns.AssemblePrompt(turn_service_pb2.AssemblePromptRequest(run_id=run_id))
    assert len(journal.entries(run_id, 1000)) == before + 1


# The database mode: the same views read from the sidecar's database, read-only.

NOW = "2026-01-02T03:04:05.678901Z"
DATABASE_VIEWS = {
    "runs": ["runs", TENANT],
    "runs-limit": ["runs", TENANT, "--limit", "1"],
    "log": ["log", "{run}", "--now", NOW],
    "log-compacted": ["log", "{compacted}", "--now", NOW],
    "prompt": ["prompt", "{run}", "--now", NOW],
    "catalog": ["catalog", TENANT, "fx"],
    "diff": ["catalog", TENANT, "fx", "--diff", "1", "2"],
    "diff-current": ["catalog", TENANT, "fx", "--diff", "1", "0"],
    "connections": ["connections", TENANT],
}


def from_database(
    grpc_server: RunningSidecar, capsys: pytest.CaptureFixture[str], *arguments: str
) -> tuple[int, str]:
    url = grpc_server.settings.resolved_database_url()
    code = cli.main(["inspect", *arguments, "--database-url", url])
    return code, capsys.readouterr().out


def view_arguments(view: str, scripted: dict[str, str]) -> list[str]:
    return [argument.format(**scripted) for argument in DATABASE_VIEWS[view]]


@pytest.mark.parametrize("view", DATABASE_VIEWS)
def test_the_database_mode_prints_what_the_grpc_mode_prints(
    grpc_server: RunningSidecar, scripted: dict[str, str], capsys: Any, view: str
) -> None:
    arguments = view_arguments(view, scripted)
    over_grpc = as_json(grpc_server, capsys, *arguments)
    code, out = from_database(grpc_server, capsys, *arguments, "--json")
    assert code == 0
    stored = json.loads(out)
    if view == "connections":
        # No MCP session runs in the database mode: the states are the stored ones, said so.
        assert over_grpc["live"] is True
        assert stored["live"] is False
        assert [c["state"] for c in stored["connections"]] == ["STORED"]
        live_only = ("state", "since", "last_error")
        for document in (over_grpc, stored):
            del document["live"]
            for connection in document["connections"]:
                for key in live_only:
                    del connection[key]
    assert stored == over_grpc
    if view != "connections":
        # The tables are the same too: one formatter for both.
        assert from_database(grpc_server, capsys, *arguments) == inspect(
            grpc_server, capsys, *arguments
        )


def test_the_database_mode_says_connection_states_are_stored(
    grpc_server: RunningSidecar, scripted: dict[str, str], capsys: Any
) -> None:
    code, table = from_database(grpc_server, capsys, "connections", TENANT)
    assert code == 0
    assert "STORED" in table.splitlines()[1]
    assert "not live" in table


def _snapshot(url: str) -> dict[str, Any]:
    """Every table's rows, and for SQLite the database file's bytes."""
    from sqlalchemy import create_engine, select

    from psych_sidecar.storage import tables

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            state: dict[str, Any] = {
                table.name: sorted(map(repr, connection.execute(select(table))))
                for table in tables.metadata.sorted_tables
            }
    finally:
        engine.dispose()
    if url.startswith("sqlite:///"):
        state["file"] = Path(url.removeprefix("sqlite:///")).read_bytes()
    return state


def test_the_database_mode_changes_nothing(
    grpc_server: RunningSidecar, scripted: dict[str, str], capsys: Any
) -> None:
    """Every view, then the database holds what it held: the same rows (no journal row, no
    pin, no migration) and, for SQLite, the same file bytes."""
    # Everything the views read is in place (the turn's pin) before the snapshot.
    for view in DATABASE_VIEWS:
        as_json(grpc_server, capsys, *view_arguments(view, scripted))
    url = grpc_server.settings.resolved_database_url()
    before = _snapshot(url)
    assert before["assembly_journal"]
    for view in DATABASE_VIEWS:
        assert from_database(grpc_server, capsys, *view_arguments(view, scripted))[0] == 0
    assert from_database(grpc_server, capsys, "log", "run_unknown")[0] == 1
    assert _snapshot(url) == before


def test_a_refused_read_from_the_database_is_reported_and_exits_1(
    grpc_server: RunningSidecar, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        [
            "inspect",
            "log",
            "run_unknown",
            "--database-url",
            grpc_server.settings.resolved_database_url(),
        ]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert "RUN_NOT_FOUND" in captured.err
    assert captured.out == ""


def test_a_turn_no_sidecar_pinned_is_previewed_from_the_database_and_not_pinned(
    grpc_server: RunningSidecar, stubs: Stubs, scripted: dict[str, str], capsys: Any
) -> None:
    """From the database, a turn without a stored surface is resolved for the preview and
    stored nowhere; over gRPC the same preview pins it (a sidecar's turn starts there)."""
    from sqlalchemy import func, select

    from psych_sidecar.storage import tables
    from psych_sidecar.storage.engines import create_database_engine

    grants = [spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")]
    run_id = run_with(stubs, "inspect-c", tenant=TENANT, grants=grants)
    append(stubs, run_id, user("hello"))
    pins = select(func.count()).where(tables.turn_surfaces.c.run_id == run_id)

    def pinned() -> int:
        engine = create_database_engine(grpc_server.settings.resolved_database_url(), pool_size=1)
        try:
            with engine.connect() as connection:
                return int(connection.execute(pins).scalar_one())
        finally:
            engine.dispose()

    assert pinned() == 0
    code, out = from_database(grpc_server, capsys, "prompt", run_id, "--json")
    assert code == 0
    assert [zone["zone"] for zone in json.loads(out)["zones"]][:2] == [
        "static_system",
        "dynamic_tail",
    ]
    assert pinned() == 0
    as_json(grpc_server, capsys, "prompt", run_id)
    assert pinned() == 1

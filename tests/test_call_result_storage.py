"""A tool result is on disk once: in the Run's log. What answers a retried call is kept as a
reference into the log (the result JSON less the parts the record holds), and the retry gets
the first answer byte for byte, whatever kind of content the result carries."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.protobuf import struct_pb2
from sqlalchemy import Engine, create_engine, text

from psych.sidecar.v1 import run_service_pb2, spec_pb2, tool_service_pb2
from tests.support.connections import fixture_commands, put_stdio
from tests.support.requests import publish
from tests.support.sidecar import Stubs

SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": fixture_commands(),
    # A 5 MB result comes back whole in the response.
    "inline_result_bytes": 16 << 20,
}
SERVER = "fx"
# The tables a tool call writes.
TABLES = ("records", "record_parts", "append_requests")


# One transport is enough: what is stored does not depend on the socket.
SIDECAR_TRANSPORTS = ["unix"]


@pytest.fixture(scope="module")
def database(database_url: str) -> Iterator[Engine]:
    """The sidecar's database, read beside it."""
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def run_id(stubs: Stubs, unique: Callable[[str], str]) -> str:
    tenant = unique("tenant")
    put_stdio(stubs, tenant, SERVER, preload=True)
    spec = unique("spec")
    publish(stubs, spec, grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
    return stubs.runs.CreateRun(
        run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec, spec_version=1)
    ).run.run_id


def call(stubs: Stubs, run_id: str, call_id: str, tool: str, **arguments: Any) -> Any:
    struct = struct_pb2.Struct()
    struct.update(arguments)
    request = tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id, server=SERVER, tool=tool, arguments=struct, call_id=call_id
    )
    return stubs.tools.CallDeferredTool(request, timeout=120).outcome


def stored_bytes(database: Engine) -> int:
    """Bytes the tables a call writes take, with their indexes: SQLite's pages (dbstat reads
    the write-ahead log's too), PostgreSQL's relations with their TOAST. Only those tables:
    the sidecar stores other things (a preloaded catalogue) on its own schedule."""
    with database.connect() as connection:
        if database.dialect.name == "sqlite":
            names = ", ".join(f"'{table}'" for table in TABLES)
            pages = text(
                "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN "
                f"(SELECT name FROM sqlite_schema WHERE tbl_name IN ({names}))"
            )
            return int(connection.execute(pages).scalar_one())
        total = " + ".join(f"pg_total_relation_size('{table}')" for table in TABLES)
        return int(connection.execute(text(f"SELECT {total}")).scalar_one())


def test_a_5_mb_result_is_stored_once(stubs: Stubs, run_id: str, database: Engine) -> None:
    size = 5 * 1000 * 1000
    # Warm up: the first call's rows and pages are not what is measured.
    call(stubs, run_id, "warm", "huge_text", size=10, seed=1)
    before = stored_bytes(database)
    first = call(stubs, run_id, "big", "huge_text", size=size, seed=7)
    grown = stored_bytes(database) - before
    assert len(json.loads(first.result_json)["content"][0]["text"]) == size
    assert grown < 5.5 * 1000 * 1000
    # The retry is answered from the log: the same bytes, and nothing more stored.
    assert call(stubs, run_id, "big", "huge_text", size=size, seed=7) == first
    assert stored_bytes(database) - before == grown


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("huge_text", {"size": 3000}),
        ("echo", {"text": 'quotes " and \\ backslashes,\n newlines and ünïcödé 🙂 ' * 20}),
        ("image", {}),
        ("audio", {}),
        ("blob", {"size": 5000}),
        ("resource_text", {}),
        ("resource_link", {}),
        ("structured", {"size": 2000}),
        ("structured", {"size": 2000, "text": False, "image": True}),
        ("tool_error", {}),
        ("fail", {}),
    ],
)
def test_a_retry_gets_the_first_answer_byte_for_byte(
    stubs: Stubs, run_id: str, database: Engine, tool: str, arguments: dict[str, Any]
) -> None:
    first = call(stubs, run_id, "c1", tool, **arguments)
    assert call(stubs, run_id, "c1", tool, **arguments) == first
    with database.connect() as connection:
        kept = connection.execute(
            text(
                "SELECT call_result_outline FROM append_requests WHERE run_id = :r "
                "AND call_result_outline IS NOT NULL"
            ),
            {"r": run_id},
        ).scalar_one()
    # What the log holds is not kept twice: only the result JSON around it.
    assert len(kept) < max(400, len(first.result_json) // 4)

"""The fault matrix: MCP servers that misbehave (tests/mcp_servers/fault_server.py and the
fixture server over stdio). For each fault: what the host sees (a clean tool result or a
connection state, never an RPC error), that the result is in the Run's log, and that health and
GetRun answer meanwhile. What a server sends that breaks the spec is the server's fault, said
as such: a result that breaks its own output schema is a tool error, and one invalid tool in a
listing is left out alone.

A list_changed flood is debounced into a few re-listings. Faults covered elsewhere, with the
fixture server: a hanging call (test_turns), a server exiting mid-call, a 50 MB result and
results larger than a response (test_faults), image, audio and blob results (test_turns, every
result kind).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    run_pb2,
    run_service_pb2,
    spec_pb2,
    tool_service_pb2,
)
from tests.support.connections import fixture_commands
from tests.support.polling import wait_for
from tests.support.requests import all_records, publish
from tests.support.sidecar import RunningSidecar, Stubs

FAULT_SERVER = Path(__file__).parent / "mcp_servers" / "fault_server.py"


# SQLite: the faults are the MCP servers'.
SIDECAR_DATABASES = ["sqlite"]
# Loopback TCP.
SIDECAR_TRANSPORTS = ["tcp"]


# The fault server and the fixture server; short connect and call timeouts so the faults show
# quickly.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": {
        "faults": {"argv": [sys.executable, str(FAULT_SERVER)], "allow_extra_args": True},
        **fixture_commands(),
    },
    "mcp_connect_timeout_seconds": 10.0,
    "tool_call_timeout_seconds": 3.0,
    "mcp_reconnect_min_seconds": 0.2,
    "mcp_reconnect_max_seconds": 1.0,
    "semantic_search": "off",
}


class Tenant:
    def __init__(self, stubs: Stubs, name: str) -> None:
        self.stubs = stubs
        self.name = name

    def connect(self, *args: str, command: str = "faults") -> connection_pb2.Connection:
        connection = connection_pb2.Connection(
            tenant=self.name,
            name="faulty",
            stdio=connection_pb2.StdioTransport(command=command, args=list(args)),
        )
        return self.stubs.connections.PutConnection(
            connection_service_pb2.PutConnectionRequest(connection=connection)
        ).connection

    def connection(self) -> connection_pb2.Connection:
        (found,) = self.stubs.connections.ListConnections(
            connection_service_pb2.ListConnectionsRequest(tenant=self.name)
        ).connections
        return found

    def run(self) -> str:
        spec = f"spec-{self.name}"
        publish(self.stubs, spec, grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
        return self.stubs.runs.CreateRun(
            run_service_pb2.CreateRunRequest(tenant=self.name, spec_name=spec, spec_version=1)
        ).run.run_id

    def call(
        self, run_id: str, tool: str, call_id: str, **arguments: Any
    ) -> tool_service_pb2.ToolOutcome:
        struct = struct_pb2.Struct()
        struct.update(arguments)
        request = tool_service_pb2.CallDeferredToolRequest(
            run_id=run_id, server="faulty", tool=tool, arguments=struct, call_id=call_id
        )
        return self.stubs.tools.CallDeferredTool(request, timeout=60).outcome

    def logged(self, run_id: str, call_id: str) -> run_pb2.Record:
        (record,) = [
            r
            for r in all_records(self.stubs, run_id)
            if r.WhichOneof("kind") == "tool_result" and r.tool_result.call_id == call_id
        ]
        return record


@pytest.fixture
def tenant(stubs: Stubs, unique: Callable[[str], str]) -> Tenant:
    """A fresh tenant, with a Run created before its connection (GetRun answers throughout)."""
    return Tenant(stubs, unique("tenant"))


@contextmanager
def answering_meanwhile(grpc_server: RunningSidecar, stubs: Stubs, run_id: str) -> Iterator[None]:
    """Health and GetRun are asked again and again while the block runs; every answer must
    come (within a generous 10 s deadline: liveness, not speed)."""
    failures: list[str] = []
    checks = [0]
    done = threading.Event()

    def poll() -> None:
        channel = grpc.insecure_channel(grpc_server.sidecar.bound[0])
        health = health_pb2_grpc.HealthStub(channel)
        try:
            while not done.is_set():
                try:
                    health.Check(health_pb2.HealthCheckRequest(), timeout=10)
                    stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=run_id), timeout=10)
                    checks[0] += 1
                except grpc.RpcError as error:
                    failures.append(str(error))
                done.wait(0.02)
        finally:
            channel.close()

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        yield
    finally:
        done.set()
        poller.join(30)
    assert failures == []
    assert checks[0] > 0


def text(outcome: tool_service_pb2.ToolOutcome) -> str:
    return "".join(part.get("text", "") for part in json.loads(outcome.result_json)["content"])


def test_garbage_on_stdout_before_the_session_and_during_a_call(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: Tenant
) -> None:
    run_id = tenant.run()
    with answering_meanwhile(grpc_server, stubs, run_id):
        tenant.connect("--garbage-first")
        wait_for(lambda: tenant.connection().catalog_version, "a listing despite the garbage")
        outcome = tenant.call(run_id, "garbage", "g1")
        after = tenant.call(run_id, "ok", "g2")
    # Either the garbage was skipped (a result) or it broke the session (a tool error): a
    # clean answer in the log either way.
    assert tenant.logged(run_id, "g1").tool_result.is_error == outcome.is_error
    assert tenant.logged(run_id, "g2").tool_result.is_error == after.is_error


def test_a_slow_tools_list_is_unreachable_with_its_reason(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: Tenant
) -> None:
    run_id = tenant.run()
    with answering_meanwhile(grpc_server, stubs, run_id):
        tenant.connect("--list-delay", "30")
        unreachable = wait_for(
            lambda: tenant.connection().state == connection_pb2.CONNECTION_STATE_UNREACHABLE,
            "the listing to time out",
        )
        assert unreachable
        outcome = tenant.call(run_id, "ok", "s1")
    assert tenant.connection().last_error
    assert outcome.is_error
    assert tenant.logged(run_id, "s1").tool_result.is_error


def test_ten_thousand_tools_are_catalogued_searched_and_called(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: Tenant
) -> None:
    run_id = tenant.run()
    with answering_meanwhile(grpc_server, stubs, run_id):
        tenant.connect("--tools", "10000")
        wait_for(lambda: tenant.connection().catalog_version, "the 10,000-tool listing")
        hits = stubs.tools.SearchTools(
            tool_service_pb2.SearchToolsRequest(run_id=run_id, query="tool_09999"), timeout=60
        ).hits
        outcome = tenant.call(run_id, "tool_09999", "t1")
    assert hits[0].tool == "tool_09999"
    assert not outcome.is_error
    assert not tenant.logged(run_id, "t1").tool_result.is_error


def test_a_stderr_flood_does_not_disturb_the_session(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: Tenant
) -> None:
    run_id = tenant.run()
    tenant.connect()
    wait_for(lambda: tenant.connection().catalog_version, "the first listing")
    with answering_meanwhile(grpc_server, stubs, run_id):
        outcome = tenant.call(run_id, "stderr_flood", "e1", mb=20)
    assert text(outcome) == "ok"
    assert not tenant.logged(run_id, "e1").tool_result.is_error


def test_a_list_changed_flood_is_debounced_and_the_session_keeps_serving(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: Tenant
) -> None:
    run_id = tenant.run()
    tenant.connect()
    wait_for(lambda: tenant.connection().catalog_version, "the first listing")
    with answering_meanwhile(grpc_server, stubs, run_id):
        flooded = tenant.call(run_id, "flood", "f1", count=2000)
        after = tenant.call(run_id, "ok", "f2")
    assert not flooded.is_error
    assert text(after) == "ok"
    assert tenant.connection().state == connection_pb2.CONNECTION_STATE_CONNECTED
    assert not tenant.logged(run_id, "f1").tool_result.is_error


def test_hang_and_exit_mid_call_are_tool_errors_in_the_log(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: Tenant
) -> None:
    run_id = tenant.run()
    tenant.connect()
    wait_for(lambda: tenant.connection().catalog_version, "the first listing")
    with answering_meanwhile(grpc_server, stubs, run_id):
        hung = tenant.call(run_id, "hang", "h1")
        exited = tenant.call(run_id, "exit", "x1")
    assert hung.is_error
    assert "did not answer" in text(hung)
    assert exited.is_error
    assert tenant.logged(run_id, "h1").tool_result.is_error
    assert tenant.logged(run_id, "x1").tool_result.is_error


# A listing that breaks the spec: each tool is judged alone.


def _catalogue(tenant: Tenant, version: int = 0) -> list[str]:
    return [
        tool.name
        for tool in tenant.stubs.connections.ListCatalogTools(
            connection_service_pb2.ListCatalogToolsRequest(
                tenant=tenant.name, name="faulty", catalog_version=version, page_size=1000
            )
        ).tools
    ]


def _versions(tenant: Tenant) -> list[connection_pb2.CatalogVersion]:
    return list(
        tenant.stubs.connections.ListCatalogVersions(
            connection_service_pb2.ListCatalogVersionsRequest(tenant=tenant.name, name="faulty")
        ).versions
    )


def test_one_invalid_tool_is_left_out_alone_and_added_once_it_is_valid(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: Tenant
) -> None:
    run_id = tenant.run()
    with answering_meanwhile(grpc_server, stubs, run_id):
        put = tenant.connect("--tools", "0", "--invalid-tools", "one", command="fixture")
        echoed = tenant.call(run_id, "echo", "v1", text="still served")
        left_out = tenant.call(run_id, "bad_schema", "v2")
    # Before: "tools.N.inputSchema.type Field required" failed the whole listing, and the
    # server was unreachable with none of its tools.
    assert put.state == connection_pb2.CONNECTION_STATE_CONNECTED
    assert put.catalog_version == 1
    first = _catalogue(tenant)
    assert "echo" in first
    assert "bad_schema" not in first
    assert put.rejected_tool_count == 1
    (rejected,) = put.rejected_tools
    assert rejected.name == "bad_schema"
    assert rejected.reason == "not a valid MCP tool: inputSchema.type: Field required"
    assert tenant.connection().rejected_tools == put.rejected_tools
    assert text(echoed) == "still served"
    assert left_out.is_error
    # Repaired, the tool is valid: a new version with it added, nothing left out.
    tenant.call(run_id, "repair_listing", "v3")
    wait_for(lambda: tenant.connection().catalog_version == 2, "the listing after the repair")
    diff = stubs.connections.DiffCatalog(
        connection_service_pb2.DiffCatalogRequest(
            tenant=tenant.name, name="faulty", from_version=1, to_version=2
        )
    )
    assert [tool.name for tool in diff.added] == ["bad_schema"]
    assert not diff.changed
    assert not diff.removed
    repaired = tenant.connection()
    assert repaired.rejected_tool_count == 0
    assert not repaired.rejected_tools
    newest, oldest = _versions(tenant)
    assert (oldest.tool_count, oldest.rejected_tool_count) == (len(first), 1)
    assert (newest.tool_count, newest.rejected_tool_count) == (len(first) + 1, 0)
    assert not tenant.call(run_id, "bad_schema", "v4").is_error


@pytest.mark.parametrize("era", ["auto", "legacy"])
def test_a_listing_with_every_tool_invalid_says_so(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: Tenant, era: str
) -> None:
    """In both protocol eras (2026-07-28, and 2025-11-25 through the handshake)."""
    run_id = tenant.run()
    put = tenant.connect("--tools", "0", "--invalid-tools", "all", "--era", era, command="fixture")
    refreshed = stubs.connections.RefreshCatalog(
        connection_service_pb2.RefreshCatalogRequest(tenant=tenant.name, name="faulty")
    )
    outcome = tenant.call(run_id, "echo", "a1", text="x")
    assert put.state == connection_pb2.CONNECTION_STATE_CONNECTED
    assert _catalogue(tenant) == []
    assert put.rejected_tool_count > 1
    assert put.rejected_tool_count == len(put.rejected_tools)
    assert all("inputSchema.type: Field required" in r.reason for r in put.rejected_tools)
    assert "echo" in [r.name for r in put.rejected_tools]
    # The version says the listing was entirely invalid; a re-listing writes no new one.
    (version,) = _versions(tenant)
    assert (version.tool_count, version.rejected_tool_count) == (0, put.rejected_tool_count)
    assert (refreshed.catalog_version, refreshed.tool_count) == (1, 0)
    assert refreshed.rejected_tool_count == put.rejected_tool_count
    assert outcome.is_error


# A result that breaks its own output schema: a tool error, the result kept.


@pytest.mark.parametrize(
    ("tool", "problem", "returned"),
    [
        ("wrong_structured", "1 is not of type 'string'", '{"y": 1}'),
        ("missing_structured", "has no structuredContent", "no structure"),
        ("remote_ref_output", "http://127.0.0.1:9/schema.json", '{"y": "z"}'),
    ],
)
def test_a_result_that_breaks_its_output_schema_is_the_servers_tool_error(
    grpc_server: RunningSidecar,
    stubs: Stubs,
    tenant: Tenant,
    caplog: pytest.LogCaptureFixture,
    tool: str,
    problem: str,
    returned: str,
) -> None:
    run_id = tenant.run()
    tenant.connect("--tools", "0", "--output-schema-faults", command="fixture")
    caplog.set_level(logging.INFO)
    with answering_meanwhile(grpc_server, stubs, run_id):
        outcome = tenant.call(run_id, tool, "o1")
    # Before: "failed inside the sidecar (RuntimeError)", an ERROR with the SDK's traceback,
    # and nothing of what the server returned in the log.
    assert outcome.is_error
    said = text(outcome)
    assert "does not match its declared output schema" in said
    assert problem in said
    assert "inside the sidecar" not in said
    assert returned in said
    record = tenant.logged(run_id, "o1")
    assert record.tool_result.is_error
    read = stubs.tools.ReadToolOutput(
        tool_service_pb2.ReadToolOutputRequest(run_id=run_id, handle=outcome.handle)
    )
    assert returned in read.text
    (warning,) = [r for r in caplog.records if "declared output schema" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert warning.exc_info is None
    assert tool in warning.getMessage()
    assert "faulty" in warning.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_result_that_keeps_its_output_schema_is_the_result(stubs: Stubs, tenant: Tenant) -> None:
    run_id = tenant.run()
    tenant.connect("--tools", "0", command="fixture")
    outcome = tenant.call(run_id, "structured", "s1")
    assert not outcome.is_error
    assert json.loads(outcome.result_json)["structuredContent"] == {"answer": 42}

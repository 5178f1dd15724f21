"""The fault matrix: MCP servers that misbehave (tests/mcp_servers/fault_server.py over stdio).
For each fault: what the host sees (a clean tool result or a connection state, never an RPC
error), that the result is in the Run's log, and that health and GetRun answer meanwhile.

A list_changed flood is debounced into a few re-listings. Faults covered elsewhere, with the
fixture server: a hanging call (test_turns), a server exiting mid-call, a 50 MB result and
results larger than a response (test_faults), image, audio and blob results (test_turns, every
result kind).
"""

from __future__ import annotations

import json
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
from tests.support.polling import wait_for
from tests.support.requests import all_records, publish
from tests.support.sidecar import RunningSidecar, Stubs

FAULT_SERVER = Path(__file__).parent / "mcp_servers" / "fault_server.py"


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """SQLite: the faults are the MCP servers'."""
    return f"sqlite:///{tmp_path_factory.mktemp('matrix') / 'sidecar.db'}"


@pytest.fixture(scope="module")
def grpc_addr() -> str:
    """Loopback TCP."""
    return "127.0.0.1:0"


# The fault server; short connect and call timeouts so the faults show quickly.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": {
        "faults": {"argv": [sys.executable, str(FAULT_SERVER)], "allow_extra_args": True}
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

    def connect(self, *args: str) -> None:
        connection = connection_pb2.Connection(
            tenant=self.name,
            name="faulty",
            stdio=connection_pb2.StdioTransport(command="faults", args=list(args)),
        )
        self.stubs.connections.PutConnection(
            connection_service_pb2.PutConnectionRequest(connection=connection)
        )

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

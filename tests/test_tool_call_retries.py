"""A retried tool call — same Run, same assistant step, same call id — is answered with the
recorded result and does not run the tool again: after a lost response (the client's deadline
passed while the tool ran), while the first attempt is still running, or later. Counted by a
real MCP server (tests/mcp_servers/counting_server.py) on both databases."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
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
)
from tests.support.databases import WITH_PGBOUNCER
from tests.support.requests import all_records, publish, user
from tests.support.sidecar import Stubs

# Tool calls, their recorded results and retries through PgBouncer in transaction mode too.
SIDECAR_DATABASES = WITH_PGBOUNCER

COUNTING_SERVER = Path(__file__).parent / "mcp_servers" / "counting_server.py"
SERVER = "cnt"


# The counting MCP server as an allowed stdio command.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": {"counting": {"argv": [sys.executable, str(COUNTING_SERVER)]}}
}


# One transport: retries are about the call, not the socket.
SIDECAR_TRANSPORTS = ["unix"]


@pytest.fixture
def run_id(stubs: Stubs, unique: Callable[[str], str]) -> str:
    """A Run of a fresh tenant with its own counting server (its own count), preloaded."""
    tenant = unique("tenant")
    connection = connection_pb2.Connection(
        tenant=tenant,
        name=SERVER,
        stdio=connection_pb2.StdioTransport(command="counting"),
        preload=True,
    )
    stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    )
    spec = unique("spec")
    publish(stubs, spec, grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
    run = stubs.runs.CreateRun(
        run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec, spec_version=1)
    ).run.run_id
    step(stubs, run, "c1")
    return run


def step(stubs: Stubs, run_id: str, *call_ids: str) -> None:
    """The model's next assistant message, calling count under these ids."""
    calls = [
        content_pb2.ToolCall(call_id=call_id, name=f"{SERVER}__count", arguments_json="{}")
        for call_id in call_ids
    ]
    stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(
            run_id=run_id,
            records=[
                user("count"),
                run_pb2.Record(assistant_message=run_pb2.AssistantMessage(tool_calls=calls)),
            ],
        )
    )


def dispatch(
    stubs: Stubs, run_id: str, call_id: str, delay: float = 0, timeout: float = 30
) -> tool_service_pb2.ToolOutcome:
    call = content_pb2.ToolCall(
        call_id=call_id, name=f"{SERVER}__count", arguments_json=json.dumps({"delay": delay})
    )
    response = stubs.tools.DispatchToolCall(
        tool_service_pb2.DispatchToolCallRequest(run_id=run_id, call=call), timeout=timeout
    )
    return response.outcome


def call_deferred(
    stubs: Stubs, run_id: str, call_id: str, tool: str = "count", **arguments: Any
) -> tool_service_pb2.ToolOutcome:
    struct = struct_pb2.Struct()
    struct.update(arguments)
    request = tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id, server=SERVER, tool=tool, arguments=struct, call_id=call_id
    )
    return stubs.tools.CallDeferredTool(request, timeout=30).outcome


def text(outcome: tool_service_pb2.ToolOutcome) -> str:
    return "".join(part.get("text", "") for part in json.loads(outcome.result_json)["content"])


def runs_counted(stubs: Stubs, run_id: str) -> int:
    """How many times the server ran `count` (asked under a call id never used before)."""
    runs_counted.asked += 1  # type: ignore[attr-defined]
    return int(text(call_deferred(stubs, run_id, f"ask-{runs_counted.asked}", tool="calls")))  # type: ignore[attr-defined]


runs_counted.asked = 0  # type: ignore[attr-defined]


def results_for(stubs: Stubs, run_id: str, call_id: str) -> list[run_pb2.Record]:
    return [
        record
        for record in all_records(stubs, run_id)
        if record.WhichOneof("kind") == "tool_result" and record.tool_result.call_id == call_id
    ]


def test_a_retried_dispatch_returns_the_recorded_result_without_running_again(
    stubs: Stubs, run_id: str
) -> None:
    first = dispatch(stubs, run_id, "c1")
    again = dispatch(stubs, run_id, "c1")
    assert text(first) == "call 1"
    assert again == first
    assert runs_counted(stubs, run_id) == 1
    assert len(results_for(stubs, run_id, "c1")) == 1
    # The same call id in the model's next step is a new call.
    step(stubs, run_id, "c1")
    assert text(dispatch(stubs, run_id, "c1")) == "call 2"
    assert len(results_for(stubs, run_id, "c1")) == 2


def test_a_retried_deferred_call_returns_the_recorded_result(stubs: Stubs, run_id: str) -> None:
    first = call_deferred(stubs, run_id, "d1")
    again = call_deferred(stubs, run_id, "d1")
    assert text(first) == "call 1"
    assert again == first
    assert runs_counted(stubs, run_id) == 1
    assert len(results_for(stubs, run_id, "d1")) == 1


def test_a_retry_while_the_first_attempt_runs_waits_for_it(stubs: Stubs, run_id: str) -> None:
    outcomes: list[tool_service_pb2.ToolOutcome] = []
    threads = [
        threading.Thread(target=lambda: outcomes.append(dispatch(stubs, run_id, "c1", delay=1)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == 3
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert runs_counted(stubs, run_id) == 1
    assert len(results_for(stubs, run_id, "c1")) == 1


def test_after_a_lost_response_the_retry_gets_the_result_recorded_meanwhile(
    stubs: Stubs, run_id: str
) -> None:
    with pytest.raises(grpc.RpcError) as lost:
        dispatch(stubs, run_id, "c1", delay=1, timeout=0.2)
    assert lost.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    retried = dispatch(stubs, run_id, "c1", delay=1)
    assert text(retried) == "call 1"
    assert runs_counted(stubs, run_id) == 1
    assert len(results_for(stubs, run_id, "c1")) == 1

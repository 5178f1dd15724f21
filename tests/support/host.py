"""What an agent host does, in the few calls the turn and prompt tests repeat."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import duration_pb2, struct_pb2

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    content_pb2,
    run_service_pb2,
    spec_pb2,
    tool_service_pb2,
    turn_pb2,
    turn_service_pb2,
)
from tests.support.connections import fixture_commands
from tests.support.requests import publish, user
from tests.support.sidecar import Stubs

# The sidecar a Host drives: the fixture MCP server allowed, quick reconnects after a kill.
HOST_SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": fixture_commands(),
    "mcp_reconnect_min_seconds": 0.2,
    "mcp_reconnect_max_seconds": 1.0,
}
ALL_TOOLS = [spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")]


class Host:
    """What an agent host does, in the few calls these tests repeat."""

    def __init__(self, stubs: Stubs, tenant: str) -> None:
        self.stubs = stubs
        self.tenant = tenant
        self.calls = 0

    def connect(self, name: str, *args: str, **fields: Any) -> connection_pb2.Connection:
        connection = connection_pb2.Connection(
            tenant=self.tenant,
            name=name,
            stdio=connection_pb2.StdioTransport(command="fixture", args=list(args)),
            **fields,
        )
        request = connection_service_pb2.PutConnectionRequest(connection=connection)
        return self.stubs.connections.PutConnection(request).connection

    def run(self, spec: str, grants: list[spec_pb2.ToolGrant] | None = None, **fields: Any) -> str:
        publish(self.stubs, spec, grants=ALL_TOOLS if grants is None else grants, **fields)
        request = run_service_pb2.CreateRunRequest(
            tenant=self.tenant, spec_name=spec, spec_version=1
        )
        return self.stubs.runs.CreateRun(request).run.run_id

    def new_turn(self, run_id: str, text: str = "next") -> None:
        """A user message: the next ResolveTurn resolves the surface anew (it is pinned per
        turn)."""
        request = run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user(text)])
        self.stubs.runs.AppendRecords(request)

    def resolve(self, run_id: str) -> turn_pb2.ToolSurface:
        request = turn_service_pb2.ResolveTurnRequest(run_id=run_id)
        return self.stubs.turns.ResolveTurn(request).surface

    def dispatch(
        self, run_id: str, name: str, arguments: Any = None, raw: str | None = None
    ) -> tool_service_pb2.DispatchToolCallResponse:
        self.calls += 1
        call = content_pb2.ToolCall(
            call_id=f"call-{self.calls}",
            name=name,
            arguments_json=raw if raw is not None else json.dumps(arguments or {}),
        )
        request = tool_service_pb2.DispatchToolCallRequest(run_id=run_id, call=call)
        return self.stubs.tools.DispatchToolCall(request)

    def call(
        self, run_id: str, server: str, tool: str, timeout: float | None = None, **arguments: Any
    ) -> tool_service_pb2.ToolOutcome:
        self.calls += 1
        struct = struct_pb2.Struct()
        struct.update(arguments)
        request = tool_service_pb2.CallDeferredToolRequest(
            run_id=run_id, server=server, tool=tool, arguments=struct, call_id=f"c{self.calls}"
        )
        if timeout is not None:
            request.timeout.CopyFrom(duration_pb2.Duration(nanos=int(timeout * 1e9)))
        return self.stubs.tools.CallDeferredTool(request).outcome


def result_text(outcome: tool_service_pb2.ToolOutcome) -> str:
    result = json.loads(outcome.result_json)
    return "".join(part.get("text", "") for part in result["content"])

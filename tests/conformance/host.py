"""The host program the MCP client conformance suite runs: it plays one scenario through the
sidecar's gRPC API only, as a host application would, and never talks to the MCP server.

    python -m tests.conformance.host SERVER_URL

The suite's runner appends the scenario server's URL and names the scenario in
MCP_CONFORMANCE_SCENARIO; PSYCH_SIDECAR_ADDRESS is the sidecar to drive (scripts/test-conformance
starts one). The host puts a streamable-HTTP connection to the URL, waits until the sidecar has
connected (or given up), then calls every tool the server listed once through CallDeferredTool,
with arguments made from each tool's input schema, and deletes the connection. It exits 0 when
the sidecar connected and every call returned a result that is not an error; otherwise it says
what the sidecar reported on stderr and exits 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from typing import Any

import grpc
from google.protobuf import struct_pb2

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    connection_service_pb2_grpc,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    spec_service_pb2,
    spec_service_pb2_grpc,
    tool_service_pb2,
    tool_service_pb2_grpc,
)

TENANT = "conformance"
# The runner gives a client 30 s per scenario by default (scripts/test-conformance gives more):
# the sidecar's first attempt, listing included, must have ended well within it.
SETTLE_SECONDS = 20.0
CALL_TIMEOUT_SECONDS = 20
RPC_TIMEOUT_SECONDS = CALL_TIMEOUT_SECONDS + 10
# A sample value per JSON Schema type, for the arguments of a call.
SAMPLES: dict[str, Any] = {
    "number": 2,
    "integer": 2,
    "string": "conformance",
    "boolean": True,
    "array": [],
    "object": {},
    "null": None,
}


def connection_name(scenario: str) -> str:
    """A connection name for the scenario (names allow letters, digits, '.', '_', '-')."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "-", scenario)[:48]
    return f"{readable}-{hashlib.sha256(scenario.encode()).hexdigest()[:8]}"


def sample_arguments(input_schema_json: bytes) -> dict[str, Any]:
    """Arguments for a call: a sample value for each required property of the schema."""
    schema = json.loads(input_schema_json) if input_schema_json else {}
    properties = schema.get("properties") or {}
    arguments: dict[str, Any] = {}
    for name in schema.get("required") or []:
        declared = (properties.get(name) or {}).get("type", "string")
        kind = declared[0] if isinstance(declared, list) else declared
        arguments[name] = SAMPLES.get(kind, "conformance")
    return arguments


def wait_until_settled(
    connections: connection_service_pb2_grpc.ConnectionServiceStub, name: str
) -> connection_pb2.Connection:
    """The connection once its first attempt ended: connected with a catalogue, or unreachable."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        listing = connections.ListConnections(
            connection_service_pb2.ListConnectionsRequest(tenant=TENANT, page_size=1000),
            timeout=RPC_TIMEOUT_SECONDS,
        )
        found = next(c for c in listing.connections if c.name == name)
        connected = found.state == connection_pb2.CONNECTION_STATE_CONNECTED
        if (connected and found.catalog_version > 0) or (
            found.state == connection_pb2.CONNECTION_STATE_UNREACHABLE
        ):
            return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def catalogue(
    connections: connection_service_pb2_grpc.ConnectionServiceStub, name: str
) -> list[connection_pb2.CatalogTool]:
    tools: list[connection_pb2.CatalogTool] = []
    token = ""
    while True:
        page = connections.ListCatalogTools(
            connection_service_pb2.ListCatalogToolsRequest(
                tenant=TENANT, name=name, page_token=token
            ),
            timeout=RPC_TIMEOUT_SECONDS,
        )
        tools.extend(page.tools)
        token = page.next_page_token
        if not token:
            return tools


def new_run(channel: grpc.Channel, name: str) -> str:
    """A Run whose Spec grants every tool of every server."""
    spec = spec_pb2.Spec(
        name=name,
        version=1,
        grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")],
    )
    spec_service_pb2_grpc.SpecServiceStub(channel).PublishSpec(
        spec_service_pb2.PublishSpecRequest(spec=spec), timeout=RPC_TIMEOUT_SECONDS
    )
    created = run_service_pb2_grpc.RunServiceStub(channel).CreateRun(
        run_service_pb2.CreateRunRequest(tenant=TENANT, spec_name=name, spec_version=1),
        timeout=RPC_TIMEOUT_SECONDS,
    )
    return str(created.run.run_id)


def call_each_tool(
    channel: grpc.Channel, run_id: str, server: str, tools: list[connection_pb2.CatalogTool]
) -> bool:
    """Call every tool once; whether every call returned a result that is not an error."""
    stub = tool_service_pb2_grpc.ToolServiceStub(channel)
    all_ok = True
    for number, tool in enumerate(tools):
        arguments = struct_pb2.Struct()
        arguments.update(sample_arguments(tool.input_schema_json))
        request = tool_service_pb2.CallDeferredToolRequest(
            run_id=run_id,
            server=server,
            tool=tool.name,
            arguments=arguments,
            call_id=f"call-{number}",
        )
        request.timeout.seconds = CALL_TIMEOUT_SECONDS
        outcome = stub.CallDeferredTool(request, timeout=RPC_TIMEOUT_SECONDS).outcome
        result = outcome.result_json.decode()
        print(f"host: {tool.name} -> is_error {outcome.is_error}: {result[:500]}", file=sys.stderr)
        all_ok = all_ok and not outcome.is_error
    return all_ok


def play(channel: grpc.Channel, scenario: str, url: str) -> bool:
    connections = connection_service_pb2_grpc.ConnectionServiceStub(channel)
    name = connection_name(scenario)
    connection = connection_pb2.Connection(
        tenant=TENANT,
        name=name,
        http=connection_pb2.HttpTransport(
            url=url, protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP
        ),
    )
    connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection),
        timeout=RPC_TIMEOUT_SECONDS,
    )
    try:
        settled = wait_until_settled(connections, name)
        state = connection_pb2.ConnectionState.Name(settled.state)
        print(f"host: connection {name}: {state} {settled.last_error}".rstrip(), file=sys.stderr)
        if settled.state != connection_pb2.CONNECTION_STATE_CONNECTED:
            return False
        tools = catalogue(connections, name)
        print(f"host: catalogue: {[tool.name for tool in tools]}", file=sys.stderr)
        return call_each_tool(channel, new_run(channel, name), name, tools)
    finally:
        # The scenario's server stops after this run: the sidecar must not keep retrying it.
        connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant=TENANT, name=name),
            timeout=RPC_TIMEOUT_SECONDS,
        )


def main() -> int:
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    address = os.environ["PSYCH_SIDECAR_ADDRESS"]
    if not scenario:
        print("host: MCP_CONFORMANCE_SCENARIO is not set", file=sys.stderr)
        return 2
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT_SECONDS)
        return 0 if play(channel, scenario, url) else 1


if __name__ == "__main__":
    sys.exit(main())

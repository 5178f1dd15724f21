"""Shutdown as docs/operations.md says: NOT_SERVING, then in-flight calls get the grace, and a
call still running when it ends is answered UNAVAILABLE / SHUTTING_DOWN (with its ErrorInfo),
not a bare CANCELLED; calls that finish within the grace are answered normally."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    run_service_pb2,
    spec_pb2,
    tool_service_pb2,
)
from psych_sidecar.config import Settings
from tests.support.connections import fixture_commands
from tests.support.polling import wait_for
from tests.support.requests import publish
from tests.support.sidecar import UNLIMITED_CHANNEL, RunningSidecar, Stubs, rpc_failure


def _call(stubs: Stubs, run_id: str, tool: str, call_id: str) -> Any:
    request = tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id, server="fx", tool=tool, arguments=struct_pb2.Struct(), call_id=call_id
    )
    request.timeout.FromSeconds(60)
    return stubs.tools.CallDeferredTool(request, timeout=60)


@pytest.mark.parametrize("grace", [0.5])
def test_calls_running_past_the_grace_are_unavailable_shutting_down(
    tmp_path: Path, grace: float
) -> None:
    settings = Settings(
        listen=["127.0.0.1:0"],
        database_url=f"sqlite:///{tmp_path / 'sidecar.db'}",
        data_dir=tmp_path,
        shutdown_grace_seconds=grace,
        mcp_commands=fixture_commands(),
    )
    running = RunningSidecar(settings).__enter__()
    stopped = False
    try:
        channel = grpc.insecure_channel(running.sidecar.bound[0], options=UNLIMITED_CHANNEL)
        stubs = Stubs.on(channel)
        connection = connection_pb2.Connection(
            tenant="t",
            name="fx",
            stdio=connection_pb2.StdioTransport(command="fixture", args=["--tools", "0"]),
            preload=True,
        )
        stubs.connections.PutConnection(
            connection_service_pb2.PutConnectionRequest(connection=connection)
        )
        publish(stubs, "s", grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
        run_id = stubs.runs.CreateRun(
            run_service_pb2.CreateRunRequest(tenant="t", spec_name="s", spec_version=1)
        ).run.run_id
        assert not _call(stubs, run_id, "pid", "warm").outcome.is_error

        failures: list[Any] = []

        def hang() -> None:
            failures.append(rpc_failure(lambda: _call(stubs, run_id, "hang", "h1")))

        caller = threading.Thread(target=hang)
        caller.start()
        wait_for(lambda: running.sidecar._in_flight.tasks, "the hanging call in flight")
        started = time.monotonic()
        running.__exit__(None, None, None)
        stopped = True
        caller.join(30)
        (failure,) = failures
        assert failure.code == grpc.StatusCode.UNAVAILABLE
        assert failure.info.reason == "SHUTTING_DOWN"
        assert float(failure.info.metadata["grace_seconds"]) == grace
        # Bounded by the grace (and the MCP sessions' own stop), not by the call's 60 s.
        assert time.monotonic() - started < 30
        channel.close()
    finally:
        if not stopped:
            running.__exit__(None, None, None)

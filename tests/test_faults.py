"""MCP servers behaving badly, with the project's fixture server over stdio: what the host sees
is a clean tool result (or a connection state), the result is in the log, and health and GetRun
answer while it happens. Results larger than a response come back elided with their handle.

SQLite and one transport: the faults are the MCP server's; storage faults have their own tests
(test_storage_faults.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    run_service_pb2,
    spec_pb2,
    tool_service_pb2,
)
from psych_sidecar.config import MIB
from psych_sidecar.mcp.session_state import describe_error
from tests.support.connections import fixture_commands
from tests.support.databases import TEST_SECRET_KEY
from tests.support.polling import wait_for
from tests.support.requests import all_records, publish
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar, Stubs

LIMIT = MIB
# The largest result a tool-call response carries whole here (below the message limit).
INLINE = 512 * 1024
# The fault matrix's large result: 50 MB of text.
FIFTY_MB = 50 * 1000 * 1000


# SQLite: the faults here are the MCP server's.
SIDECAR_DATABASES = ["sqlite"]
# Loopback TCP.
SIDECAR_TRANSPORTS = ["tcp"]


# The smallest message limit, so a few-MB result is already larger than a response.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": fixture_commands(),
    "max_message_bytes": LIMIT,
    "inline_result_bytes": INLINE,
    "mcp_reconnect_min_seconds": 0.2,
    "mcp_reconnect_max_seconds": 1.0,
}


@pytest.fixture
def run_id(stubs: Stubs, unique: Callable[[str], str]) -> str:
    """A Run of a fresh tenant with its own fixture server connected (no bulk tools)."""
    return fixture_run(stubs, unique("tenant"), unique("spec"))


def fixture_run(stubs: Stubs, tenant: str, spec: str) -> str:
    """A Run of `tenant` with its fixture server `fx` connected (no bulk tools)."""
    connection = connection_pb2.Connection(
        tenant=tenant,
        name="fx",
        stdio=connection_pb2.StdioTransport(command="fixture", args=["--tools", "0"]),
        preload=True,
    )
    stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    )
    publish(stubs, spec, grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
    return stubs.runs.CreateRun(
        run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec, spec_version=1)
    ).run.run_id


@contextlib.contextmanager
def own_sidecar(
    tmp_path: Path, overrides: dict[str, Any] | None = None, **options: Any
) -> Iterator[tuple[Stubs, str]]:
    """A sidecar of this module's settings plus `overrides`, built with `options`, and a Run
    on it with the fixture server connected: for a fault the shared sidecar must not have."""
    settings = flat_settings(
        listen=[f"unix://{tmp_path / 's.sock'}"],
        database_url=f"sqlite:///{tmp_path / 'sidecar.db'}",
        data_dir=tmp_path,
        shutdown_grace_seconds=5,
        secret_keys=TEST_SECRET_KEY,
        **SIDECAR_OVERRIDES,
        **(overrides or {}),
    )
    with RunningSidecar(settings, **options) as running, running.stubs() as stubs:
        yield stubs, fixture_run(stubs, "tenant", "spec")


def call(
    stubs: Stubs, run_id: str, tool: str, call_id: str, **arguments: Any
) -> tool_service_pb2.ToolOutcome:
    struct = struct_pb2.Struct()
    struct.update(arguments)
    request = tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id, server="fx", tool=tool, arguments=struct, call_id=call_id
    )
    return stubs.tools.CallDeferredTool(request, timeout=120).outcome


def text(outcome: tool_service_pb2.ToolOutcome) -> str:
    return "".join(part.get("text", "") for part in json.loads(outcome.result_json)["content"])


def stored_length(stubs: Stubs, run_id: str, handle: str) -> int:
    request = tool_service_pb2.ReadToolOutputRequest(run_id=run_id, handle=handle, limit=1)
    return stubs.tools.ReadToolOutput(request).total_length


def answering(grpc_server: RunningSidecar, stubs: Stubs, run_id: str) -> None:
    """Health and GetRun answer (each within a generous deadline: liveness, not speed)."""
    channel = grpc.insecure_channel(grpc_server.sidecar.bound[0])
    try:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()
    assert stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=run_id), timeout=10).run.run_id


def test_a_result_larger_than_a_response_is_elided_with_its_handle_and_kept_whole(
    stubs: Stubs, run_id: str
) -> None:
    size = 3 * LIMIT
    outcome = call(stubs, run_id, "huge_text", "c1", size=size)
    assert not outcome.is_error
    assert len(outcome.result_json) < LIMIT
    meta = json.loads(outcome.result_json)["_meta"]["psych.sidecar/elided"]
    assert meta["handle"] == outcome.handle
    assert meta["result_json_bytes"] > size
    assert outcome.handle in text(outcome)
    assert stored_length(stubs, run_id, outcome.handle) == size


def test_a_result_over_the_inline_size_is_elided_though_a_message_could_carry_it(
    stubs: Stubs, run_id: str
) -> None:
    small = call(stubs, run_id, "huge_text", "small", size=INLINE // 2)
    assert text(small) == "x" * (INLINE // 2)
    over = call(stubs, run_id, "huge_text", "over", size=INLINE + 1000)
    assert len(over.result_json) < INLINE < LIMIT - 64 * 1024
    meta = json.loads(over.result_json)["_meta"]["psych.sidecar/elided"]
    assert meta == {"handle": over.handle, "result_json_bytes": meta["result_json_bytes"]}
    assert meta["result_json_bytes"] > INLINE
    assert stored_length(stubs, run_id, over.handle) == INLINE + 1000


def test_a_retried_large_call_is_answered_from_the_log_byte_for_byte(
    stubs: Stubs, run_id: str
) -> None:
    # Over a MiB, SQLite's copies are streamed into their rows (storage/appends.py): the
    # recorded result the retry is answered with, and the log's text, read back whole.
    first = call(stubs, run_id, "huge_text", "retried", size=3 * MIB)
    again = call(stubs, run_id, "huge_text", "retried", size=3 * MIB)
    assert again == first
    assert stored_length(stubs, run_id, first.handle) == 3 * MIB
    read = stubs.tools.ReadToolOutput(
        tool_service_pb2.ReadToolOutputRequest(
            run_id=run_id, handle=first.handle, offset=MIB - 3, limit=6
        )
    )
    assert read.text == "x" * 6


def call_while_answering(
    grpc_server: RunningSidecar, stubs: Stubs, run_id: str, tool: str, call_id: str, size: int
) -> tool_service_pb2.ToolOutcome:
    """The outcome of `tool(size=size)`, called on another thread while health and GetRun are
    checked, again and again, until it lands (at least once)."""
    outcomes: list[tool_service_pb2.ToolOutcome] = []
    landing = threading.Thread(
        target=lambda: outcomes.append(call(stubs, run_id, tool, call_id, size=size))
    )
    landing.start()
    checks = 0
    while landing.is_alive():
        answering(grpc_server, stubs, run_id)
        checks += 1
    landing.join()
    assert checks > 0
    (outcome,) = outcomes
    return outcome


def test_health_and_get_run_answer_while_a_large_result_lands(
    grpc_server: RunningSidecar, stubs: Stubs, run_id: str
) -> None:
    outcome = call_while_answering(grpc_server, stubs, run_id, "huge_text", "big", FIFTY_MB)
    assert stored_length(stubs, run_id, outcome.handle) == FIFTY_MB


def test_a_large_blob_is_stored_as_its_bytes_while_health_and_get_run_answer(
    grpc_server: RunningSidecar, stubs: Stubs, run_id: str
) -> None:
    # Its base64 (~21 MB here) is decoded in slices (bulk/slices.py): one decode of 50 MB held
    # the GIL ~145 ms.
    size = 16 * MIB
    outcome = call_while_answering(grpc_server, stubs, run_id, "blob", "big-blob", size)
    assert not outcome.is_error
    read = stubs.tools.ReadToolOutput(
        tool_service_pb2.ReadToolOutputRequest(
            run_id=run_id, handle=outcome.handle, offset=size - 300, limit=300
        )
    )
    assert read.total_length == size
    assert read.mime_type == "application/octet-stream"
    assert read.data == (bytes(range(256)) * (size // 256))[-300:]


def test_a_server_exiting_mid_call_is_a_tool_error_in_the_log(
    grpc_server: RunningSidecar, stubs: Stubs, run_id: str
) -> None:
    outcome = call(stubs, run_id, "exit", "c1")
    assert outcome.is_error
    (record,) = [r for r in all_records(stubs, run_id) if r.WhichOneof("kind") == "tool_result"]
    assert record.tool_result.is_error
    assert record.tool_result.call_id == "c1"
    answering(grpc_server, stubs, run_id)


def test_a_bug_during_a_call_is_logged_with_its_stack_and_the_model_gets_a_tool_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Stands in for a bug in the sidecar's own result conversion: nothing in a real server
    # can make correct code raise this.
    def broken(result: Any) -> Any:
        raise KeyError("a bug")

    with (
        own_sidecar(tmp_path, convert_tool_result=broken) as (stubs, run_id),
        caplog.at_level(logging.ERROR, logger="psych_sidecar.mcp.tool_calls"),
    ):
        outcome = call(stubs, run_id, "echo", "c1", text="hi")
        assert outcome.is_error
        (logged,) = [r for r in caplog.records if "unexpected error calling" in r.getMessage()]
        assert logged.exc_info is not None
        correlation_id = logged.getMessage().rsplit(" ", 1)[-1]
        assert correlation_id in text(outcome)
        assert any(
            r.tool_result.call_id == "c1" and r.tool_result.is_error
            for r in all_records(stubs, run_id)
            if r.WhichOneof("kind") == "tool_result"
        )


def test_a_stdio_line_over_the_limit_is_a_tool_error_and_the_server_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server's line longer than the sidecar reads (256 MiB by default; 1 MiB here, so a
    2 MiB result crosses it) closes the connection: the call is a tool error in the log, the
    reason is logged, and the server is reconnected."""
    with (
        own_sidecar(tmp_path, {"mcp_stdio_max_line_bytes": MIB}) as (stubs, run_id),
        caplog.at_level(logging.WARNING, logger="psych_sidecar.mcp.session"),
    ):
        outcome = call(stubs, run_id, "huge_text", "big", size=2 * MIB)
        assert outcome.is_error
        assert "closed" in text(outcome)
        assert any(f"more than {MIB} bytes" in r.getMessage() for r in caplog.records)
        logged = [
            r.tool_result
            for r in all_records(stubs, run_id)
            if r.WhichOneof("kind") == "tool_result" and r.tool_result.call_id == "big"
        ]
        assert [result.is_error for result in logged] == [True]
        wait_for(
            lambda: not call(stubs, run_id, "echo", f"back-{time.monotonic()}", text="hi").is_error,
            "the server to be reconnected after the long line",
        )


def test_a_stream_that_ends_without_a_message_is_described_not_just_named() -> None:
    """anyio's stream errors carry no message: a warning or last_error saying only
    "BrokenResourceError" tells an operator nothing (the session's warning adds the connection
    and what it was doing)."""
    assert describe_error(anyio.BrokenResourceError()) == (
        "the transport's stream ended (BrokenResourceError)"
    )
    grouped = BaseExceptionGroup("lost", [anyio.EndOfStream(), TimeoutError()])
    assert describe_error(grouped) == "the transport's stream ended (EndOfStream); timed out"

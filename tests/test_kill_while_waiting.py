"""kill -9 of a real `psych-sidecar serve` process while a call waits, on PostgreSQL: another
sidecar on the same database takes over.

- A call waiting for its user's input: the host's answer, given to another sidecar,
  continues it on 2026-07-28 (the request state travels with the stored round) and the
  server's final result is recorded once; on 2025-11-25 the question lived in the dead
  sidecar's session, so the call ends as a recorded tool error saying it was lost.
- A call running as a task: the task completes after the sidecar that started it was killed,
  and the other sidecar appends its result once; a task that asks its user, answered on the
  other sidecar, goes on (tasks/update) and ends once.

PostgreSQL only: many sidecars on one database is what it is for (a SQLite file has one
writer process at a time)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    content_pb2,
    run_pb2,
    run_service_pb2,
    spec_pb2,
    tool_service_pb2,
)
from tests.support.connections import listed, put_http
from tests.support.polling import wait_for
from tests.support.processes import HttpServer, ServedSidecar, free_port, running
from tests.support.requests import all_records, publish, user
from tests.support.sidecar import Stubs

SIDECAR_DATABASES = ["postgresql"]

MCP_SERVERS = Path(__file__).parent / "mcp_servers"
COMMANDS = {
    "asking": {"argv": [sys.executable, str(MCP_SERVERS / "asking_server.py")]},
    "asking-legacy": {
        "argv": [sys.executable, str(MCP_SERVERS / "asking_server.py"), "--era", "legacy"]
    },
}
ERAS = {"modern": "asking", "legacy": "asking-legacy"}
# A task call's timeout here (the sidecars' default is short, for the task's claim): also how
# long the task runner waits for its session to connect, on a sidecar that never ran the
# server before (a busy machine takes seconds to start a Python MCP server).
SESSION_START = duration_pb2.Duration(seconds=60)
# How long a host here keeps sending an answer the sidecar could not give yet (its session to
# the server still connecting): as long as a busy machine may take to start the server.
ANSWER_WITHIN = 60.0


@contextlib.contextmanager
def serving(database_url: str, data_dir: Path) -> Iterator[tuple[ServedSidecar, Stubs]]:
    """`psych-sidecar serve` on the database, and stubs on its channel. Stopped on the way
    out unless the test killed it."""
    address = f"127.0.0.1:{free_port()}"
    served = ServedSidecar(
        "--listen",
        address,
        "--database-url",
        database_url,
        "--data-dir",
        str(data_dir),
        env={
            "PSYCH_SIDECAR_SEMANTIC_SEARCH": "off",
            "PSYCH_SIDECAR_MCP_COMMANDS": json.dumps(COMMANDS),
            "PSYCH_SIDECAR_TASK_POLL_MIN_SECONDS": "0.05",
            "PSYCH_SIDECAR_TASK_POLL_MAX_SECONDS": "0.2",
            "PSYCH_SIDECAR_MCP_RECONNECT_MIN_SECONDS": "0.1",
            "PSYCH_SIDECAR_MCP_RECONNECT_MAX_SECONDS": "0.5",
            # A claim of the killed sidecar runs out within seconds.
            "PSYCH_SIDECAR_TOOL_CALL_TIMEOUT_SECONDS": "5",
        },
    )
    try:
        served.wait_serving()
        with grpc.insecure_channel(address) as channel:
            yield served, Stubs.on(channel)
    finally:
        served.stop()


def new_run(
    stubs: Stubs, unique: Callable[[str], str], connection: connection_pb2.Connection
) -> str:
    stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    )
    spec = unique("spec")
    publish(stubs, spec, grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
    request = run_service_pb2.CreateRunRequest(
        tenant=connection.tenant, spec_name=spec, spec_version=1
    )
    return stubs.runs.CreateRun(request).run.run_id


def model_calls_ask_name(stubs: Stubs, run_id: str) -> None:
    """The user's message and the model's call c1 of ask/ask_name, in the Run's log."""
    calls = [content_pb2.ToolCall(call_id="c1", name="ask__ask_name", arguments_json="{}")]
    stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(
            run_id=run_id,
            records=[
                user("ask me"),
                run_pb2.Record(assistant_message=run_pb2.AssistantMessage(tool_calls=calls)),
            ],
        )
    )


def text(outcome: tool_service_pb2.ToolOutcome) -> str:
    return "".join(part.get("text", "") for part in json.loads(outcome.result_json)["content"])


def ask(stubs: Stubs, run_id: str) -> tool_service_pb2.CallDeferredToolResponse:
    request = tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id, server="ask", tool="ask_name", call_id="c1", arguments=struct_pb2.Struct()
    )
    return stubs.tools.CallDeferredTool(request, timeout=60)


def connected(stubs: Stubs, tenant: str) -> None:
    """Wait until this sidecar's session to `ask` is connected: a call on a session still
    connecting is a recorded tool error saying so (the model may call again), which is not
    what these tests are about."""
    wait_for(
        lambda: listed(stubs, tenant)["ask"].state == connection_pb2.CONNECTION_STATE_CONNECTED,
        "the session to the asking server",
        within=ANSWER_WITHIN,
    )


def given(
    stubs: Stubs, answer: tool_service_pb2.ContinueToolCallRequest
) -> tool_service_pb2.ContinueToolCallResponse:
    """The answer sent as a host does: again while the sidecar says it could not give it yet
    (CONNECTION_UNREACHABLE, UNAVAILABLE: its session to the server is still connecting)."""
    deadline = time.monotonic() + ANSWER_WITHIN
    while True:
        response = sent(stubs, answer)
        if not isinstance(response, grpc.RpcError):
            return response
        if time.monotonic() > deadline or not not_given_yet(response):
            raise response
        time.sleep(0.2)


def sent(
    stubs: Stubs, answer: tool_service_pb2.ContinueToolCallRequest
) -> tool_service_pb2.ContinueToolCallResponse | grpc.RpcError:
    """The answer sent once: the response, or the RPC's failure."""
    try:
        return stubs.tools.ContinueToolCall(answer, timeout=60)
    except grpc.RpcError as error:
        return error


def not_given_yet(error: grpc.RpcError) -> bool:
    """Whether a ContinueToolCall failed retryably: its answer was not given, its round
    still waits."""
    failure: Any = error
    status = rpc_status.from_call(failure)
    if failure.code() is not grpc.StatusCode.UNAVAILABLE or status is None:
        return False
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason == "CONNECTION_UNREACHABLE"
    return False


def results_of(stubs: Stubs, run_id: str, call_id: str) -> list[run_pb2.Record]:
    return [
        record
        for record in all_records(stubs, run_id)
        if record.HasField("tool_result") and record.tool_result.call_id == call_id
    ]


@pytest.mark.parametrize("era", list(ERAS))
def test_an_answer_after_a_kill_9_continues_on_another_sidecar(
    database_url: str, tmp_path: Path, unique: Callable[[str], str], era: str
) -> None:
    tenant = unique("tenant")
    connection = connection_pb2.Connection(
        tenant=tenant,
        name="ask",
        stdio=connection_pb2.StdioTransport(command=ERAS[era]),
        preload=True,
    )
    with serving(database_url, tmp_path / "first") as (first, stubs):
        run_id = new_run(stubs, unique, connection)
        model_calls_ask_name(stubs, run_id)
        connected(stubs, tenant)
        waiting = ask(stubs, run_id).input_required
        assert waiting.attempt
        first.kill()
    answer = tool_service_pb2.ContinueToolCallRequest(
        run_id=run_id,
        call_id="c1",
        attempt=waiting.attempt,
        answers=[
            tool_service_pb2.InputAnswer(
                key=waiting.requests[0].key,
                action=tool_service_pb2.INPUT_ACTION_ACCEPT,
                content=struct_pb2.Struct(fields={"name": struct_pb2.Value(string_value="Zed")}),
            )
        ],
    )
    with serving(database_url, tmp_path / "second") as (_, stubs):
        done = given(stubs, answer)
        if era == "modern":
            assert not done.outcome.is_error
            assert text(done.outcome) == "hello Zed"
        else:
            # The question was held in the killed sidecar's session: a typed, recorded
            # tool error saying so.
            assert done.outcome.is_error
            assert "lost" in text(done.outcome)
        # The answer retried and the call retried get the same recorded outcome.
        assert stubs.tools.ContinueToolCall(answer, timeout=60).outcome == done.outcome
        assert ask(stubs, run_id).outcome.sequence == done.outcome.sequence
        (recorded,) = results_of(stubs, run_id, "c1")
        assert recorded.sequence == done.outcome.sequence


def test_an_answer_on_a_sidecar_still_connecting_to_the_server_is_not_lost(
    database_url: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """The answer goes to a sidecar started right before it, whose session to the server is
    still connecting: the answer waits for it within the call's timeout, or fails retryably
    (CONNECTION_UNREACHABLE, the round still open, nothing recorded) and the same answer sent
    again is given. Either way the server's result is recorded, once; never the session's
    "still connecting"."""
    tenant = unique("tenant")
    connection = connection_pb2.Connection(
        tenant=tenant, name="ask", stdio=connection_pb2.StdioTransport(command=ERAS["modern"])
    )
    with serving(database_url, tmp_path / "first") as (_, stubs):
        run_id = new_run(stubs, unique, connection)
        model_calls_ask_name(stubs, run_id)
        connected(stubs, tenant)
        waiting = ask(stubs, run_id).input_required
        name = struct_pb2.Struct(fields={"name": struct_pb2.Value(string_value="Zed")})
        answer = tool_service_pb2.ContinueToolCallRequest(
            run_id=run_id,
            call_id="c1",
            attempt=waiting.attempt,
            answers=[
                tool_service_pb2.InputAnswer(
                    key=waiting.requests[0].key,
                    action=tool_service_pb2.INPUT_ACTION_ACCEPT,
                    content=name,
                )
            ],
        )
        with serving(database_url, tmp_path / "second") as (_, other):
            # The second sidecar starts its session to the server as it starts serving.
            state = listed(other, tenant)["ask"].state
            assert state == connection_pb2.CONNECTION_STATE_CONNECTING
            # An answer given no time to wait for the session: not given, the round open.
            hurried = tool_service_pb2.ContinueToolCallRequest()
            hurried.CopyFrom(answer)
            hurried.timeout.FromNanoseconds(1_000)
            early = sent(other, hurried)
            if isinstance(early, grpc.RpcError):
                assert not_given_yet(early), early
                assert results_of(other, run_id, "c1") == []
                assert ask(other, run_id).input_required.attempt == waiting.attempt
            else:
                # The session connected in the meantime after all: the answer was given.
                assert not early.outcome.is_error
            done = given(other, answer)
        assert not done.outcome.is_error
        assert text(done.outcome) == "hello Zed"
        # Retried on the first sidecar: the same recorded outcome, recorded once.
        assert stubs.tools.ContinueToolCall(answer, timeout=60).outcome == done.outcome
        (recorded,) = results_of(stubs, run_id, "c1")
        assert recorded.sequence == done.outcome.sequence


def test_a_task_completes_after_a_kill_9_of_the_sidecar_that_started_it(
    database_url: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    port = free_port()
    task_server = [sys.executable, str(MCP_SERVERS / "task_server.py"), "--port", str(port)]
    with running(HttpServer(task_server, port)):
        url = f"http://127.0.0.1:{port}/mcp"
        tenant = unique("tenant")
        with serving(database_url, tmp_path / "first") as (first, stubs):
            put_http(stubs, tenant, "jobs", url)
            spec = unique("spec")
            publish(stubs, spec, grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
            run_id = stubs.runs.CreateRun(
                run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec, spec_version=1)
            ).run.run_id
            started = stubs.tools.CallDeferredTool(
                tool_service_pb2.CallDeferredToolRequest(
                    run_id=run_id,
                    server="jobs",
                    tool="job",
                    call_id="c1",
                    arguments=struct_pb2.Struct(
                        fields={"name": struct_pb2.Value(string_value="killed")}
                    ),
                    execution=tool_service_pb2.TOOL_CALL_EXECUTION_LONG_RUNNING,
                ),
                timeout=30,
            ).outcome
            assert started.task.state == tool_service_pb2.TOOL_TASK_STATE_WORKING
            first.kill()
        with serving(database_url, tmp_path / "second") as (_, stubs):
            finish = tool_service_pb2.CallDeferredToolRequest(
                run_id=run_id,
                server="jobs",
                tool="finish",
                call_id="finish",
                arguments=struct_pb2.Struct(
                    fields={
                        "name": struct_pb2.Value(string_value="killed"),
                        "outcome": struct_pb2.Value(string_value="complete"),
                    }
                ),
            )
            assert not stubs.tools.CallDeferredTool(finish, timeout=30).outcome.is_error
            get = tool_service_pb2.GetToolTaskRequest(run_id=run_id, call_id="c1")
            wait_for(
                lambda: stubs.tools.GetToolTask(get).task.result_call_id != "",
                "the task's end",
            )
            task = stubs.tools.GetToolTask(get).task
            assert task.state == tool_service_pb2.TOOL_TASK_STATE_COMPLETED
            (ended,) = results_of(stubs, run_id, task.result_call_id)
            assert ended.tool_result.content[0].text == "job killed done"
            assert (ended.sequence, ended.handle) == (task.result_sequence, task.result_handle)


def test_a_tasks_question_is_answered_after_a_kill_9_on_another_sidecar(
    database_url: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """A running task's own questions are the server's to hold (the task lives there): the
    answer given to another sidecar goes on with tasks/update, and the task's end is
    appended once."""
    port = free_port()
    task_server = [sys.executable, str(MCP_SERVERS / "task_server.py"), "--port", str(port)]
    with running(HttpServer(task_server, port)):
        tenant = unique("tenant")
        get = tool_service_pb2.GetToolTaskRequest(call_id="c1")
        with serving(database_url, tmp_path / "first") as (first, stubs):
            put_http(stubs, tenant, "jobs", f"http://127.0.0.1:{port}/mcp")
            spec = unique("spec")
            publish(stubs, spec, grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
            get.run_id = stubs.runs.CreateRun(
                run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec, spec_version=1)
            ).run.run_id
            stubs.tools.CallDeferredTool(
                tool_service_pb2.CallDeferredToolRequest(
                    run_id=get.run_id,
                    server="jobs",
                    tool="ask_job",
                    call_id="c1",
                    arguments=struct_pb2.Struct(
                        fields={"name": struct_pb2.Value(string_value="crash")}
                    ),
                    execution=tool_service_pb2.TOOL_CALL_EXECUTION_LONG_RUNNING,
                    timeout=SESSION_START,
                ),
                timeout=90,
            )
            wait_for(
                lambda: stubs.tools.GetToolTask(get).task.HasField("input_required"),
                "the task's question",
            )
            waiting = stubs.tools.GetToolTask(get).task.input_required
            first.kill()
        content = struct_pb2.Struct(fields={"confirm": struct_pb2.Value(bool_value=True)})
        answer = tool_service_pb2.ContinueToolCallRequest(
            run_id=get.run_id,
            call_id="c1",
            attempt=waiting.attempt,
            timeout=SESSION_START,
            answers=[
                tool_service_pb2.InputAnswer(
                    key="crash-1", action=tool_service_pb2.INPUT_ACTION_ACCEPT, content=content
                )
            ],
        )
        with serving(database_url, tmp_path / "second") as (_, stubs):
            answered = stubs.tools.ContinueToolCall(answer, timeout=90).task
            assert answered.state in (
                tool_service_pb2.TOOL_TASK_STATE_WORKING,
                tool_service_pb2.TOOL_TASK_STATE_COMPLETED,
            )
            wait_for(
                lambda: stubs.tools.GetToolTask(get).task.result_call_id != "", "the task's end"
            )
            task = stubs.tools.GetToolTask(get).task
            assert task.state == tool_service_pb2.TOOL_TASK_STATE_COMPLETED
            # The answer retried: the task as it stands, nothing appended again.
            again = stubs.tools.ContinueToolCall(answer, timeout=90).task
            assert again.result_call_id == task.result_call_id
            (ended,) = results_of(stubs, get.run_id, task.result_call_id)
            assert ended.tool_result.content[0].text == (
                'job crash answered: crash-1=accept {"confirm": true}'
            )

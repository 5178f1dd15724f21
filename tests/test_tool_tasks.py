"""Long calls as tasks on their MCP server (the tasks extension), against the project's own
task server (tests/mcp_servers/task_server.py) run for real, through real sidecars on SQLite and
PostgreSQL: a task that completes after the sidecar that started it stopped (another sidecar on
the same database ends it), one that fails, one the host cancels, a model's call dispatched
as long-running (its end waits for the rest of its step), a task that asks its user for input
(its questions reach the host through GetToolTask and the prompt, ContinueToolCall answers
them with tasks/update; unanswered, it ends as a recorded tool error); a call not marked
long-running, or to a server without tasks, runs as any other."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import struct_pb2

from psych.sidecar.v1 import content_pb2, run_pb2, run_service_pb2, spec_pb2, tool_service_pb2
from psych_sidecar.app.graph import task_timings
from tests.support.connections import fixture_http, put_http
from tests.support.databases import TEST_SECRET_KEY, pooling_of
from tests.support.polling import wait_for
from tests.support.processes import HttpServer, free_port, running
from tests.support.prompts import assemble
from tests.support.requests import all_records, publish, user
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

TASK_SERVER = Path(__file__).parent / "mcp_servers" / "task_server.py"
LONG = tool_service_pb2.TOOL_CALL_EXECUTION_LONG_RUNNING
PLAIN = tool_service_pb2.TOOL_CALL_EXECUTION_UNSPECIFIED
COMPLETED = tool_service_pb2.TOOL_TASK_STATE_COMPLETED


@pytest.fixture(scope="module")
def task_server() -> Iterator[str]:
    """The task server, for the whole module: its tasks outlive the sidecars that start them."""
    port = free_port()
    with running(HttpServer([sys.executable, str(TASK_SERVER), "--port", str(port)], port)):
        yield f"http://127.0.0.1:{port}/mcp"


@contextlib.contextmanager
def sidecar(database_url: str, tmp_path: Path, name: str, **overrides: Any) -> Iterator[Stubs]:
    """A sidecar of its own on the module's database (its polls quick), and its stubs."""
    settings = flat_settings(
        listen=[f"unix://{tmp_path / f'{name}.sock'}"],
        database_url=database_url,
        database_pooling=pooling_of(database_url),
        data_dir=tmp_path / name,
        shutdown_grace_seconds=5,
        secret_keys=TEST_SECRET_KEY,
        mcp_reconnect_min_seconds=0.1,
        mcp_reconnect_max_seconds=0.5,
        task_poll_min_seconds=0.05,
        task_poll_max_seconds=0.2,
        # A poll cut short by a stop is claimed again within seconds.
        tool_call_timeout_seconds=5,
        **overrides,
    )
    with RunningSidecar(settings) as server, server.stubs() as stubs:
        yield stubs


def new_run(stubs: Stubs, unique: Callable[[str], str], url: str) -> str:
    tenant = unique("tenant")
    put_http(stubs, tenant, "jobs", url)
    spec = unique("spec")
    publish(stubs, spec, grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")])
    request = run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec, spec_version=1)
    return stubs.runs.CreateRun(request).run.run_id


def call(
    stubs: Stubs,
    run_id: str,
    tool: str,
    call_id: str,
    execution: int = LONG,
    server: str = "jobs",
    **arguments: Any,
) -> tool_service_pb2.ToolOutcome:
    struct = struct_pb2.Struct()
    struct.update(arguments)
    request = tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id,
        server=server,
        tool=tool,
        arguments=struct,
        call_id=call_id,
        execution=execution,  # type: ignore[arg-type]
    )
    return stubs.tools.CallDeferredTool(request, timeout=30).outcome


def text(result_json: bytes) -> str:
    return "".join(part.get("text", "") for part in json.loads(result_json)["content"])


def task_of(stubs: Stubs, run_id: str, call_id: str) -> tool_service_pb2.ToolTask:
    request = tool_service_pb2.GetToolTaskRequest(run_id=run_id, call_id=call_id)
    return stubs.tools.GetToolTask(request).task


def ended(stubs: Stubs, run_id: str, call_id: str) -> tool_service_pb2.ToolTask:
    wait_for(lambda: task_of(stubs, run_id, call_id).result_call_id != "", "the task's end")
    return task_of(stubs, run_id, call_id)


def finish(stubs: Stubs, run_id: str, name: str, outcome: str) -> None:
    done = call(stubs, run_id, "finish", f"finish-{name}", PLAIN, name=name, outcome=outcome)
    assert not done.is_error, text(done.result_json)


def last_step(stubs: Stubs, run_id: str) -> tuple[run_pb2.Record, run_pb2.Record]:
    *_, step, result = all_records(stubs, run_id)
    return step, result


def test_a_task_completes_after_the_sidecar_that_started_it_stopped(
    database_url: str, tmp_path: Path, unique: Callable[[str], str], task_server: str
) -> None:
    with sidecar(database_url, tmp_path, "first") as stubs:
        run_id = new_run(stubs, unique, task_server)
        outcome = call(stubs, run_id, "job", "c1", name="restart")
        assert not outcome.is_error
        assert "started and is running" in text(outcome.result_json)
        assert outcome.task.state == tool_service_pb2.TOOL_TASK_STATE_WORKING
        assert (outcome.task.call_id, outcome.task.tool) == ("c1", "job")
        before = all_records(stubs, run_id)
    # The job ends while no sidecar runs; another sidecar on the database ends the task.
    with sidecar(database_url, tmp_path, "second") as stubs:
        finish(stubs, run_id, "restart", "complete")
        task = ended(stubs, run_id, "c1")
        assert task.state == tool_service_pb2.TOOL_TASK_STATE_COMPLETED
        records = all_records(stubs, run_id)
        # Only appended: what the model saw before is as it was (the prompt's prefix).
        assert records[: len(before)] == before
        step, result = last_step(stubs, run_id)
        (tool_call,) = step.assistant_message.tool_calls
        assert tool_call.name == "mcp_task_result"
        assert json.loads(tool_call.arguments_json) == {"call_id": "c1"}
        assert result.tool_result.call_id == tool_call.call_id == task.result_call_id
        assert not result.tool_result.is_error
        assert result.tool_result.content[0].text == "job restart done"
        assert (result.sequence, result.handle) == (task.result_sequence, task.result_handle)


def test_a_task_that_fails_ends_as_a_tool_error(
    database_url: str, tmp_path: Path, unique: Callable[[str], str], task_server: str
) -> None:
    with sidecar(database_url, tmp_path, "failing") as stubs:
        run_id = new_run(stubs, unique, task_server)
        call(stubs, run_id, "job", "c1", name="fails")
        finish(stubs, run_id, "fails", "fail")
        task = ended(stubs, run_id, "c1")
        assert task.state == tool_service_pb2.TOOL_TASK_STATE_FAILED
        _, result = last_step(stubs, run_id)
        assert result.tool_result.is_error
        said = result.tool_result.content[0].text
        assert "failed without a result" in said
        assert "job fails broke" in said


def test_a_task_the_host_cancels_ends_at_once(
    database_url: str, tmp_path: Path, unique: Callable[[str], str], task_server: str
) -> None:
    with sidecar(database_url, tmp_path, "cancelling") as stubs:
        run_id = new_run(stubs, unique, task_server)
        started = call(stubs, run_id, "job", "c1", name="cancelled")
        request = tool_service_pb2.CancelToolTaskRequest(run_id=run_id, call_id="c1")
        task = stubs.tools.CancelToolTask(request).task
        assert task.state == tool_service_pb2.TOOL_TASK_STATE_CANCELLED
        assert task.result_call_id
        _, result = last_step(stubs, run_id)
        assert result.tool_result.is_error
        assert "cancelled by the host" in result.tool_result.content[0].text
        # The server was asked to cancel it.
        cancels = call(stubs, run_id, "cancels", "c2", PLAIN)
        assert started.task.task_id in json.loads(text(cancels.result_json))
        # Again: the task as it ended, nothing appended twice.
        count = len(all_records(stubs, run_id))
        assert stubs.tools.CancelToolTask(request).task == task
        assert len(all_records(stubs, run_id)) == count


def test_without_long_running_or_without_tasks_a_call_runs_as_before(
    database_url: str, tmp_path: Path, unique: Callable[[str], str], task_server: str
) -> None:
    with sidecar(database_url, tmp_path, "plain") as stubs:
        run_id = new_run(stubs, unique, task_server)
        plain = call(stubs, run_id, "job", "c1", PLAIN, name="plain")
        assert text(plain.result_json) == "job plain ran"
        assert not plain.HasField("task")
        failure = rpc_failure(
            lambda: stubs.tools.GetToolTask(
                tool_service_pb2.GetToolTaskRequest(run_id=run_id, call_id="c1")
            )
        )
        assert failure.info.reason == "TOOL_TASK_NOT_FOUND"
        # A server without the extension: the long-running call waits for its result.
        port = free_port()
        with running(fixture_http(port, "--tools", "1")):
            tenant = stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=run_id)).run.tenant
            put_http(stubs, tenant, "plainserver", f"http://127.0.0.1:{port}/mcp")
            echoed = call(stubs, run_id, "echo", "c2", LONG, server="plainserver", text="hi")
            assert text(echoed.result_json) == "hi"
            assert not echoed.HasField("task")


def test_a_models_call_marked_long_running_ends_in_a_step_after_its_own(
    database_url: str, tmp_path: Path, unique: Callable[[str], str], task_server: str
) -> None:
    with sidecar(database_url, tmp_path, "dispatching") as stubs:
        run_id = new_run(stubs, unique, task_server)
        calls = [
            content_pb2.ToolCall(
                call_id=call_id, name="jobs__job", arguments_json=json.dumps({"name": call_id})
            )
            for call_id in ("m1", "m2")
        ]
        stubs.runs.AppendRecords(
            run_service_pb2.AppendRecordsRequest(
                run_id=run_id,
                records=[
                    user("run the jobs"),
                    run_pb2.Record(assistant_message=run_pb2.AssistantMessage(tool_calls=calls)),
                ],
            )
        )

        def dispatch(call: content_pb2.ToolCall) -> tool_service_pb2.ToolOutcome:
            request = tool_service_pb2.DispatchToolCallRequest(
                run_id=run_id, call=call, execution=LONG
            )
            return stubs.tools.DispatchToolCall(request, timeout=30).outcome

        first = dispatch(calls[0])
        assert first.task.state == tool_service_pb2.TOOL_TASK_STATE_WORKING
        finish(stubs, run_id, "m1", "complete")
        # m2 of the same step has no result yet: m1's end waits for it, it does not land
        # between the step and m2's result.
        wait_for(lambda: task_of(stubs, run_id, "m1").state == COMPLETED, "m1 polled: completed")
        assert task_of(stubs, run_id, "m1").result_call_id == ""
        dispatch(calls[1])
        task = ended(stubs, run_id, "m1")
        kinds = [record.WhichOneof("kind") for record in all_records(stubs, run_id)]
        assert kinds == [
            "user_message",
            "assistant_message",
            "tool_result",  # m1: started
            "tool_result",  # the host's finish call (CallDeferredTool)
            "tool_result",  # m2: started
            "assistant_message",  # mcp_task_result for m1
            "tool_result",
        ]
        _, result = last_step(stubs, run_id)
        assert result.tool_result.call_id == task.result_call_id
        assert result.tool_result.content[0].text == "job m1 done"


def test_a_call_offered_as_a_task_whose_server_asks_first_waits_for_input(
    database_url: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """A long-running call whose server answers with its questions (2026-07-28
    input_required) instead of a task waits for the host's answer as any call does, and
    ContinueToolCall ends it with the server's result, not as a task."""
    port = free_port()
    with (
        running(fixture_http(port, "--tasks", "--asking-tools")),
        sidecar(database_url, tmp_path, "asking") as stubs,
    ):
        run_id = new_run(stubs, unique, f"http://127.0.0.1:{port}/mcp")
        request = tool_service_pb2.CallDeferredToolRequest(
            run_id=run_id,
            server="jobs",
            tool="ask",
            call_id="c1",
            arguments=struct_pb2.Struct(),
            execution=LONG,
        )
        first = stubs.tools.CallDeferredTool(request, timeout=30)
        assert not first.HasField("outcome")
        waiting = first.input_required
        assert [asked.key for asked in waiting.requests] == ["name"]
        content = struct_pb2.Struct()
        content.update({"name": "Grace"})
        answer = tool_service_pb2.InputAnswer(
            key="name", action=tool_service_pb2.INPUT_ACTION_ACCEPT, content=content
        )
        answered = stubs.tools.ContinueToolCall(
            tool_service_pb2.ContinueToolCallRequest(
                run_id=run_id, call_id="c1", attempt=waiting.attempt, answers=[answer]
            ),
            timeout=30,
        )
        assert text(answered.outcome.result_json) == "hello Grace"
        assert not answered.outcome.HasField("task")


def asking_task(stubs: Stubs, run_id: str, name: str, questions: int) -> tool_service_pb2.ToolTask:
    """An ask_job call started as a task, once its questions reached the host."""
    started = call(stubs, run_id, "ask_job", "c1", name=name, questions=questions)
    assert started.task.task_id

    def asking() -> tool_service_pb2.ToolTask | None:
        task = task_of(stubs, run_id, "c1")
        return task if task.HasField("input_required") else None

    return wait_for(asking, "the task's questions")


def answer(
    stubs: Stubs, run_id: str, attempt: str, *answers: tool_service_pb2.InputAnswer
) -> tool_service_pb2.ContinueToolCallResponse:
    request = tool_service_pb2.ContinueToolCallRequest(
        run_id=run_id, call_id="c1", attempt=attempt, answers=answers
    )
    return stubs.tools.ContinueToolCall(request, timeout=30)


def test_a_tasks_own_questions_reach_the_host_and_its_answers_continue_it(
    database_url: str,
    tmp_path: Path,
    unique: Callable[[str], str],
    task_server: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with sidecar(database_url, tmp_path, "task-asks") as stubs:
        run_id = new_run(stubs, unique, task_server)
        task = asking_task(stubs, run_id, "deploy", 2)
        assert task.state == tool_service_pb2.TOOL_TASK_STATE_INPUT_REQUIRED
        waiting = task.input_required
        assert (waiting.call_id, waiting.server, waiting.tool) == ("c1", "jobs", "ask_job")
        assert [r.key for r in waiting.requests] == ["deploy-1", "deploy-2"]
        assert waiting.requests[0].message == "Go ahead with job deploy? (question 1)"
        assert waiting.requests[0].mode == tool_service_pb2.INPUT_REQUEST_MODE_FORM
        assert json.loads(waiting.requests[0].requested_schema_json)["required"] == ["confirm"]
        # The model's view: the transient zone says which call waits and why.
        transient = assemble(stubs, run_id).prompt.transient.parts[0].content.text
        (line,) = [line for line in transient.splitlines() if line.startswith("Tool call")]
        assert line.startswith("Tool call c1 (jobs/ask_job) waits for the user's input: Go ahead")
        assert len(line) < 200
        content = struct_pb2.Struct()
        content.update({"confirm": True, "note": "secret-note-7"})
        accepted = tool_service_pb2.InputAnswer(
            key="deploy-1", action=tool_service_pb2.INPUT_ACTION_ACCEPT, content=content
        )
        declined = tool_service_pb2.InputAnswer(
            key="deploy-2", action=tool_service_pb2.INPUT_ACTION_DECLINE
        )
        with caplog.at_level("INFO"):
            answered = answer(stubs, run_id, waiting.attempt, accepted, declined)
        # The task runs on with the answers; nothing ended in the log yet by the answer.
        assert not answered.HasField("outcome")
        assert not answered.HasField("input_required")
        assert answered.task.task_id == task.task_id
        assert answered.task.state in (
            tool_service_pb2.TOOL_TASK_STATE_WORKING,
            tool_service_pb2.TOOL_TASK_STATE_COMPLETED,
        )
        assert not answered.task.HasField("input_required")
        # How each was answered is logged, never what the user entered.
        assert "deploy-1=accept" in caplog.text
        assert "secret-note-7" not in caplog.text
        ended_task = ended(stubs, run_id, "c1")
        assert ended_task.state == COMPLETED
        _, result = last_step(stubs, run_id)
        assert result.tool_result.content[0].text == (
            'job deploy answered: deploy-1=accept {"confirm": true, "note": "secret-note-7"}; '
            "deploy-2=decline null"
        )
        # A retry of the answer gets the task as it stands (ended), nothing appended again.
        count = len(all_records(stubs, run_id))
        again = answer(stubs, run_id, waiting.attempt, accepted, declined)
        assert again.task.result_call_id == ended_task.result_call_id
        assert len(all_records(stubs, run_id)) == count
        transient = assemble(stubs, run_id).prompt.transient.parts[0].content.text
        assert "waits for the user" not in transient


def test_a_tasks_question_nobody_answers_ends_it_as_a_recorded_tool_error(
    database_url: str, tmp_path: Path, unique: Callable[[str], str], task_server: str
) -> None:
    with sidecar(database_url, tmp_path, "task-unanswered", mcp_input_wait_seconds=1) as stubs:
        run_id = new_run(stubs, unique, task_server)
        task = asking_task(stubs, run_id, "ignored", 1)
        done = ended(stubs, run_id, "c1")
        assert done.state == tool_service_pb2.TOOL_TASK_STATE_FAILED
        assert not done.HasField("input_required")
        _, result = last_step(stubs, run_id)
        assert result.tool_result.is_error
        said = result.tool_result.content[0].text
        assert "nobody answered within 1 seconds" in said
        assert "Go ahead with job ignored?" in said
        # The server was asked to cancel it.
        cancels = call(stubs, run_id, "cancels", "c2", PLAIN)
        assert task.task_id in json.loads(text(cancels.result_json))
        # An answer that comes too late gets the ended task, not a second end.
        late = answer(stubs, run_id, task.input_required.attempt)
        assert late.task.result_call_id == done.result_call_id


@pytest.mark.parametrize(
    ("look", "first_poll", "tick"), [(0.5, 1.0, 0.5), (30.0, 1.0, 1.0), (30.0, 60.0, 30.0)]
)
def test_the_look_for_due_tasks_is_as_often_as_set_and_never_later_than_a_first_poll(
    look: float, first_poll: float, tick: float
) -> None:
    settings = flat_settings(task_look_seconds=look, task_poll_min_seconds=first_poll)
    assert task_timings(settings.mcp).tick == tick

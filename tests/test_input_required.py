"""Tool calls whose MCP server asks the user for input before it answers, through the host:
the call answers InputRequired (the server's questions, as sent), the host continues it with
ContinueToolCall (accept with content, decline, cancel), and the server's final result is
recorded in the Run's log. Against a real MCP server on the SDK
(tests/mcp_servers/asking_server.py) in both eras: 2026-07-28 (input_required results, the
call repeated with the answers and the echoed request state) and 2025-11-25 (elicitation/create
held open in the session), on both databases."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
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
from psych_sidecar.storage import tables
from tests.support.prompts import assemble
from tests.support.requests import all_records, publish, user
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

ASKING_SERVER = Path(__file__).parent / "mcp_servers" / "asking_server.py"
# How long a question waits for its answer here: long enough for a test that answers at
# once (the one that never answers moves the stored deadline instead of waiting it out).
WAIT_SECONDS = 6

SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": {
        "asking": {"argv": [sys.executable, str(ASKING_SERVER)]},
        "asking-legacy": {"argv": [sys.executable, str(ASKING_SERVER), "--era", "legacy"]},
    },
    "mcp_input_wait_seconds": WAIT_SECONDS,
}
# One transport: this is about the call, not the socket.
SIDECAR_TRANSPORTS = ["unix"]

ERAS = {"modern": "asking", "legacy": "asking-legacy"}
ACCEPT = tool_service_pb2.INPUT_ACTION_ACCEPT
DECLINE = tool_service_pb2.INPUT_ACTION_DECLINE


@pytest.fixture(params=list(ERAS))
def era(request: pytest.FixtureRequest) -> str:
    """Which protocol era the asking server speaks."""
    return str(request.param)


@pytest.fixture
def run_id(stubs: Stubs, unique: Callable[[str], str], era: str) -> Iterator[str]:
    """A Run of a fresh tenant whose connection `ask` is the asking server in `era`, with an
    assistant step calling it."""
    tenant = unique("tenant")
    connection = connection_pb2.Connection(
        tenant=tenant,
        name="ask",
        stdio=connection_pb2.StdioTransport(command=ERAS[era]),
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
    calls = [content_pb2.ToolCall(call_id="c1", name="ask__ask_name", arguments_json="{}")]
    stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(
            run_id=run,
            records=[
                user("ask me"),
                run_pb2.Record(assistant_message=run_pb2.AssistantMessage(tool_calls=calls)),
            ],
        )
    )
    yield run
    stubs.connections.DeleteConnection(
        connection_service_pb2.DeleteConnectionRequest(tenant=tenant, name="ask")
    )


def call(
    stubs: Stubs, run_id: str, tool: str, call_id: str = "c1"
) -> tool_service_pb2.CallDeferredToolResponse:
    request = tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id, server="ask", tool=tool, call_id=call_id, arguments=struct_pb2.Struct()
    )
    # The session may still be connecting: its first call waits for it.
    return stubs.tools.CallDeferredTool(request, timeout=60)


def answer(
    stubs: Stubs,
    run_id: str,
    waiting: tool_service_pb2.InputRequired,
    *answers: tool_service_pb2.InputAnswer,
) -> tool_service_pb2.ContinueToolCallResponse:
    request = tool_service_pb2.ContinueToolCallRequest(
        run_id=run_id, call_id=waiting.call_id, attempt=waiting.attempt, answers=answers
    )
    return stubs.tools.ContinueToolCall(request, timeout=60)


def accept(key: str, **content: Any) -> tool_service_pb2.InputAnswer:
    struct = struct_pb2.Struct()
    struct.update(content)
    return tool_service_pb2.InputAnswer(key=key, action=ACCEPT, content=struct)


def text(outcome: tool_service_pb2.ToolOutcome) -> str:
    return "".join(part.get("text", "") for part in json.loads(outcome.result_json)["content"])


def keys(waiting: tool_service_pb2.InputRequired) -> list[str]:
    return [request.message for request in waiting.requests]


def test_a_form_answered_ends_with_the_servers_result_recorded(stubs: Stubs, run_id: str) -> None:
    first = stubs.tools.DispatchToolCall(
        tool_service_pb2.DispatchToolCallRequest(
            run_id=run_id,
            call=content_pb2.ToolCall(call_id="c1", name="ask__ask_name", arguments_json="{}"),
        ),
        timeout=60,
    )
    assert first.disposition == tool_service_pb2.DISPATCH_DISPOSITION_INPUT_REQUIRED
    waiting = first.input_required
    assert (waiting.call_id, waiting.server, waiting.tool) == ("c1", "ask", "ask_name")
    (question,) = waiting.requests
    assert question.mode == tool_service_pb2.INPUT_REQUEST_MODE_FORM
    assert question.message == "What is your name?"
    schema = json.loads(question.requested_schema_json)
    assert schema["properties"]["name"]["default"] == "Ada"
    sent = json.loads(question.request_json)
    assert sent["method"] == "elicitation/create"
    assert sent["params"]["message"] == "What is your name?"
    # Nothing is in the log for the call while it waits; a retry gets the same questions.
    assert not any(r.HasField("tool_result") for r in all_records(stubs, run_id))
    again = call(stubs, run_id, "ask_name").input_required
    assert again.attempt == waiting.attempt

    # Accepted with no content: the schema's default is what the server gets.
    done = answer(
        stubs, run_id, waiting, tool_service_pb2.InputAnswer(key=question.key, action=ACCEPT)
    )
    assert not done.HasField("input_required")
    assert text(done.outcome) == "hello Ada"
    assert not done.outcome.is_error
    (recorded,) = [r for r in all_records(stubs, run_id) if r.HasField("tool_result")]
    assert recorded.tool_result.call_id == "c1"
    # A retry of the answer, and of the call, get the recorded result; nothing runs again.
    assert text(answer(stubs, run_id, waiting).outcome) == "hello Ada"
    assert call(stubs, run_id, "ask_name").outcome.sequence == done.outcome.sequence


def test_two_rounds_each_with_its_own_attempt(stubs: Stubs, run_id: str) -> None:
    first = call(stubs, run_id, "ask_twice").input_required
    assert keys(first) == ["What is your name?"]
    second = answer(stubs, run_id, first, accept(first.requests[0].key, name="Bo"))
    assert second.HasField("input_required")
    assert keys(second.input_required) == ["How old are you?"]
    assert second.input_required.attempt != first.attempt
    # The first round's answer sent again gets the round it led to.
    retried = answer(stubs, run_id, first, accept(first.requests[0].key, name="Bo"))
    assert retried.input_required.attempt == second.input_required.attempt
    done = answer(
        stubs, run_id, second.input_required, accept(second.input_required.requests[0].key, age="7")
    )
    assert text(done.outcome) == "Bo is 7"


def test_several_requests_in_one_round(stubs: Stubs, run_id: str, era: str) -> None:
    waiting = call(stubs, run_id, "ask_many").input_required
    while True:
        # 2026-07-28 asks both at once; 2025-11-25 one after the other.
        answers = [
            accept(request.key, **{"name": "Cy"} if "name" in request.message else {"color": "red"})
            for request in waiting.requests
        ]
        if era == "modern":
            assert len(answers) == 2
        response = answer(stubs, run_id, waiting, *answers)
        if not response.HasField("input_required"):
            break
        waiting = response.input_required
    assert text(response.outcome) == "Cy likes red"


def test_a_decline_is_a_tool_error_the_model_can_act_on(stubs: Stubs, run_id: str) -> None:
    waiting = call(stubs, run_id, "ask_name").input_required
    done = answer(
        stubs,
        run_id,
        waiting,
        tool_service_pb2.InputAnswer(key=waiting.requests[0].key, action=DECLINE),
    )
    assert done.outcome.is_error
    assert text(done.outcome) == "the user declined"


def test_a_url_is_handed_over_not_opened(stubs: Stubs, run_id: str, era: str) -> None:
    waiting = call(stubs, run_id, "open_url").input_required
    (question,) = waiting.requests
    assert question.mode == tool_service_pb2.INPUT_REQUEST_MODE_URL
    assert question.url == "https://sign-in.invalid/start"
    assert question.message == "Sign in to the tracker"
    if era == "legacy":
        assert question.elicitation_id == "sign-in-1"
    # The URL's host does not resolve: had the sidecar fetched it, nothing would differ
    # here, but the server only learns that the user consented.
    done = answer(
        stubs, run_id, waiting, tool_service_pb2.InputAnswer(key=question.key, action=ACCEPT)
    )
    assert text(done.outcome) == "url accepted"


def test_the_transient_zone_says_which_call_waits(stubs: Stubs, run_id: str) -> None:
    waiting = call(stubs, run_id, "ask_name").input_required
    prompt = assemble(stubs, run_id)
    transient = prompt.prompt.transient.parts[0].content.text
    (line,) = [line for line in transient.splitlines() if line.startswith("Tool call")]
    assert line == "Tool call c1 (ask/ask_name) waits for the user's input: What is your name?"
    assert len(line) < 200
    answer(stubs, run_id, waiting, accept(waiting.requests[0].key, name="Di"))
    prompt = assemble(stubs, run_id)
    assert "waits for the user" not in prompt.prompt.transient.parts[0].content.text


def test_an_attempt_no_call_waits_on_is_a_typed_error(stubs: Stubs, run_id: str) -> None:
    request = tool_service_pb2.ContinueToolCallRequest(
        run_id=run_id, call_id="c1", attempt="1.not-an-attempt"
    )
    failure = rpc_failure(lambda: stubs.tools.ContinueToolCall(request, timeout=30))
    assert failure.info.reason == "INPUT_NOT_AWAITED"


def test_a_host_that_never_answers_gets_a_recorded_tool_error(
    stubs: Stubs, run_id: str, grpc_server: RunningSidecar
) -> None:
    waiting = call(stubs, run_id, "ask_name").input_required
    # The round waits mcp_input_wait_seconds from when it was asked; its stored deadline, not
    # any timer, decides whether an answer is late. Moved into the past, it has passed.
    rounds = tables.tool_input_rounds
    with grpc_server.stored() as connection:
        ((asked, deadline),) = connection.execute(
            sa.select(rounds.c.create_time_us, rounds.c.expire_time_us).where(
                rounds.c.run_id == run_id
            )
        ).all()
        assert deadline - asked == WAIT_SECONDS * 1_000_000
        connection.execute(
            sa.update(rounds).where(rounds.c.run_id == run_id).values(expire_time_us=asked - 1)
        )
    done = answer(stubs, run_id, waiting, accept(waiting.requests[0].key, name="late"))
    assert done.outcome.is_error
    assert "nobody answered within" in text(done.outcome)
    # Nothing lost: it is in the log, and a retry of the call gets it.
    assert call(stubs, run_id, "ask_name").outcome.sequence == done.outcome.sequence
    assert any(r.HasField("tool_result") for r in all_records(stubs, run_id))


@pytest.mark.parametrize("era", ["modern"])
def test_a_tampered_or_missing_request_state_is_the_servers_to_judge(
    stubs: Stubs, run_id: str, grpc_server: RunningSidecar
) -> None:
    waiting = call(stubs, run_id, "ask_name").input_required
    with grpc_server.stored() as connection:
        connection.execute(
            sa.text("UPDATE tool_input_rounds SET request_state = :state WHERE run_id = :run"),
            {"state": '{"body": "{}", "tag": "forged"}', "run": run_id},
        )
    done = answer(stubs, run_id, waiting, accept(waiting.requests[0].key, name="Eve"))
    assert done.outcome.is_error
    assert "tampered" in text(done.outcome)
    # A server that sent no state gets none back.
    stateless = call(stubs, run_id, "no_state", call_id="c2").input_required
    done = answer(stubs, run_id, stateless, accept(stateless.requests[0].key, ok="yes"))
    assert text(done.outcome) == "state: none"


def test_a_hundred_calls_wait_at_once(
    stubs: Stubs, run_id: str, era: str, grpc_server: RunningSidecar
) -> None:
    ids = [f"many-{index}" for index in range(100)]
    tenant = stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=run_id)).run.tenant
    with ThreadPoolExecutor(16) as pool:
        waiting = list(pool.map(lambda i: call(stubs, run_id, "ask_name", call_id=i), ids))
        assert all(w.HasField("input_required") for w in waiting)
        # What waits in memory: nothing on 2026-07-28 (the rounds are rows); one held call
        # each on 2025-11-25 (its question open in the session), bounded by mcp_max_held_calls.
        session = grpc_server.sidecar.mcp.running_session(tenant, "ask")
        assert session is not None
        assert len(session.calls.held) == (100 if era == "legacy" else 0)
        done = list(
            pool.map(
                lambda w: answer(
                    stubs,
                    run_id,
                    w.input_required,
                    accept(w.input_required.requests[0].key, name=w.input_required.call_id),
                ),
                waiting,
            )
        )
    assert sorted(text(d.outcome) for d in done) == sorted(f"hello {i}" for i in ids)
    # Nothing is held once they are answered.
    assert len(session.calls.held) == 0


def test_another_sidecar_continues_the_call(
    stubs: Stubs, run_id: str, era: str, grpc_server: RunningSidecar, tmp_path: Path
) -> None:
    """2026-07-28 is stateless: a sidecar that never saw the call repeats it with the answers
    (its own session, its own server process). 2025-11-25 holds the question in the first
    sidecar's session: elsewhere the call ends as a tool error saying it was lost."""
    waiting = call(stubs, run_id, "ask_name").input_required
    base = grpc_server.settings
    listeners = base.listeners.model_copy(update={"listen": [f"unix://{tmp_path / 'o.sock'}"]})
    settings = base.model_copy(update={"listeners": listeners, "data_dir": tmp_path})
    with RunningSidecar(settings) as other, other.stubs() as other_stubs:
        done = answer(other_stubs, run_id, waiting, accept(waiting.requests[0].key, name="Zed"))
    if era == "modern":
        assert text(done.outcome) == "hello Zed"
    else:
        assert done.outcome.is_error
        assert "lost" in text(done.outcome)
    # Recorded once, whichever sidecar answered.
    assert call(stubs, run_id, "ask_name").outcome.sequence == done.outcome.sequence

"""Programmatic tool calling from the Spec, over the real server on both databases: the
Anthropic and OpenAI Responses bodies give every tool its `allowed_callers` and carry the
provider's sandbox tool (validated with the official SDKs' types), the other bodies are
unchanged, bad settings are refused at publish, and a call made from the sandbox comes back
through DispatchToolCall like any other, its provider block sent back as it came."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc

from psych.sidecar.v1 import content_pb2, run_pb2, spec_pb2, spec_service_pb2
from tests.support.prompts import (
    append,
    assemble,
    assistant,
    dispatch,
    provider_block,
    result,
    run_with,
    valid_anthropic,
    valid_gemini,
    valid_openai,
    valid_openai_responses,
)
from tests.support.requests import publish, user
from tests.support.sidecar import Stubs, rpc_failure

MODEL_AND_CODE = spec_pb2.ProgrammaticCalling(callers=spec_pb2.TOOL_CALLERS_MODEL_AND_CODE)


def test_the_bodies_let_the_providers_sandbox_call_every_tool(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    name = unique("agent")
    run_id = run_with(stubs, name, programmatic_calling=MODEL_AND_CODE)
    append(stubs, run_id, user("Count the open tickets."))
    response = assemble(stubs, run_id)

    anthropic = valid_anthropic(response.anthropic_request_json)
    sandbox, *tools = anthropic["tools"]
    assert sandbox == {"type": "code_execution_20260120", "name": "code_execution"}
    assert tools, "the sidecar's own tools at least"
    for tool in tools:
        assert tool["allowed_callers"] == ["direct", "code_execution_20260120"], tool["name"]

    responses = valid_openai_responses(response.openai_responses_request_json)
    sandbox, *functions = responses["tools"]
    assert sandbox == {"type": "programmatic_tool_calling"}
    assert [f["name"] for f in functions] == [t["name"] for t in tools]
    for function in functions:
        assert function["allowed_callers"] == ["direct", "programmatic"], function["name"]

    # Chat Completions and Gemini have no equivalent: their bodies do not change.
    assert "allowed_callers" not in json.dumps(valid_openai(response.openai_request_json))
    assert b"allowed_callers" not in response.gemini_request_json
    valid_gemini(response.gemini_request_json)

    got = stubs.specs.GetSpec(spec_service_pb2.GetSpecRequest(name=name, version=1)).spec
    assert got.programmatic_calling == MODEL_AND_CODE


def test_code_only_callers_and_a_later_code_execution_tool(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    settings = spec_pb2.ProgrammaticCalling(
        callers=spec_pb2.TOOL_CALLERS_CODE_ONLY,
        anthropic_code_execution_tool="code_execution_20260521",
    )
    run_id = run_with(stubs, unique("agent"), programmatic_calling=settings)
    append(stubs, run_id, user("Go."))
    response = assemble(stubs, run_id)
    sandbox, *tools = valid_anthropic(response.anthropic_request_json)["tools"]
    assert sandbox == {"type": "code_execution_20260521", "name": "code_execution"}
    assert {json.dumps(t["allowed_callers"]) for t in tools} == {'["code_execution_20260521"]'}
    _, *functions = valid_openai_responses(response.openai_responses_request_json)["tools"]
    assert {json.dumps(f["allowed_callers"]) for f in functions} == {'["programmatic"]'}


def test_without_it_the_bodies_carry_no_callers_and_no_sandbox(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    append(stubs, run_id, user("Go."))
    response = assemble(stubs, run_id)
    for body in (response.anthropic_request_json, response.openai_responses_request_json):
        assert b"allowed_callers" not in body
        assert b"code_execution" not in body
        assert b"programmatic_tool_calling" not in body


def test_settings_no_request_could_carry_are_refused_at_publish(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    def refused(settings: spec_pb2.ProgrammaticCalling) -> tuple[str, str]:
        failure = rpc_failure(
            lambda: publish(stubs, unique("agent"), programmatic_calling=settings)
        )
        assert failure.code is grpc.StatusCode.INVALID_ARGUMENT
        return failure.info.reason, failure.info.metadata["field"]

    field = "spec.programmatic_calling.anthropic_code_execution_tool"
    for tool in ("code_execution_20250522", "code_execution", "bash_20250124"):
        too_old = spec_pb2.ProgrammaticCalling(
            callers=spec_pb2.TOOL_CALLERS_MODEL_AND_CODE, anthropic_code_execution_tool=tool
        )
        assert refused(too_old) == ("FIELD_INVALID", field)
    alone = spec_pb2.ProgrammaticCalling(anthropic_code_execution_tool="code_execution_20260120")
    assert refused(alone) == ("FIELD_INVALID", field)
    unknown = spec_pb2.ProgrammaticCalling(callers=7)  # type: ignore[arg-type]
    assert refused(unknown) == ("FIELD_INVALID", "spec.programmatic_calling.callers")


def test_a_call_from_the_sandbox_comes_back_through_dispatch(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), programmatic_calling=MODEL_AND_CODE)
    tickets = {"items": [{"id": f"T-{i}", "open": i % 3 == 0} for i in range(30)]}
    (listed,) = append(
        stubs,
        run_id,
        user("How many tickets are open?"),
        assistant("", ("toolu_0", "host_tool", "{}")),
        result("toolu_0", json.dumps(tickets)),
    )[-1:]
    # Claude's response: code run in the sandbox, which calls read_tool_output. The host
    # appends the blocks as they came (the tool_use with its caller spells the call).
    code = b'{"type":"server_tool_use","id":"srvtoolu_1","name":"code_execution","input":{"code":"r = await read_tool_output(handle=h, query=q)"}}'  # noqa: E501
    arguments = {"handle": listed.handle, "query": "length(items[?open])"}
    tool_use = json.dumps(
        {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "read_tool_output",
            "input": arguments,
            "caller": {"type": "code_execution_20260120", "tool_id": "srvtoolu_1"},
        },
        separators=(",", ":"),
    ).encode()
    anthropic = content_pb2.PROVIDER_ANTHROPIC
    append(
        stubs,
        run_id,
        run_pb2.Record(
            assistant_message=run_pb2.AssistantMessage(
                content=[
                    provider_block(anthropic, code, "server_tool_use"),
                    provider_block(anthropic, tool_use, "tool_use", call_id="toolu_1"),
                ],
                tool_calls=[
                    content_pb2.ToolCall(
                        call_id="toolu_1",
                        name="read_tool_output",
                        arguments_json=json.dumps(arguments),
                    )
                ],
            )
        ),
    )
    outcome = dispatch(stubs, run_id, "toolu_1", "read_tool_output", arguments).outcome
    assert not outcome.is_error
    assert json.loads(outcome.result_json)["content"][0]["text"] == "10"

    body = assemble(stubs, run_id).anthropic_request_json
    parsed = valid_anthropic(body)
    assert code in body
    assert tool_use in body
    last_assistant = [m for m in parsed["messages"] if m["role"] == "assistant"][-1]
    assert [b["type"] for b in last_assistant["content"]] == ["server_tool_use", "tool_use"]
    answer = parsed["messages"][-1]["content"][0]
    assert (answer["type"], answer["tool_use_id"]) == ("tool_result", "toolu_1")

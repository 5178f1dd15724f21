"""DispatchToolCall end to end over the real server on both databases: the model's
read_tool_output and load_skill calls, its mistakes as tool results, host tools."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from functools import partial

import grpc

from psych.sidecar.v1 import spec_pb2, tool_service_pb2
from tests.support.prompts import (
    append,
    assemble,
    assistant,
    binary,
    dispatch,
    history_results,
    result,
    run_with,
    thresholds,
    valid_anthropic,
    valid_openai,
)
from tests.support.requests import all_records, user
from tests.support.sidecar import Stubs, rpc_failure

EXECUTED = tool_service_pb2.DISPATCH_DISPOSITION_EXECUTED
HOST_TOOL = tool_service_pb2.DISPATCH_DISPOSITION_HOST_TOOL
BIG = "".join(f"row {i}: value {i * 7}\n" for i in range(4000))


def elided_run(stubs: Stubs, spec_name: str) -> tuple[str, str]:
    """A Run whose first turn's big result is elided; returns (run id, its handle)."""
    run_id = run_with(stubs, spec_name, thresholds=thresholds(per_result_tokens=1000))
    append(stubs, run_id, user("fetch"), assistant("", ("c1", "fetch", "{}")))
    (appended,) = append(stubs, run_id, result("c1", BIG))
    append(stubs, run_id, user("now look closer"))
    assert history_results(assemble(stubs, run_id))["c1"].elided
    return run_id, appended.handle


def model_calls(
    stubs: Stubs, run_id: str, call_id: str, name: str, arguments: object
) -> tool_service_pb2.DispatchToolCallResponse:
    """What a host does: append the model's call, then dispatch it."""
    arguments_json = arguments if isinstance(arguments, str) else json.dumps(arguments)
    append(stubs, run_id, assistant("", (call_id, name, arguments_json)))
    return dispatch(stubs, run_id, call_id, name, arguments)


def result_text(response: tool_service_pb2.DispatchToolCallResponse) -> str:
    content = json.loads(response.outcome.result_json)["content"]
    return "".join(block["text"] for block in content if block["type"] == "text")


def test_read_tool_output_through_dispatch_end_to_end(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id, handle = elided_run(stubs, unique("agent"))
    response = model_calls(
        stubs, run_id, "r1", "read_tool_output", {"handle": handle, "offset": 100, "limit": 50}
    )
    assert response.disposition == EXECUTED
    outcome = response.outcome
    assert not outcome.is_error
    assert json.loads(outcome.result_json) == {
        "content": [
            {
                "type": "text",
                "text": BIG[100:150]
                + f"\n[Characters 100 to 150 of {len(BIG)}: continue with offset 150.]",
            }
        ],
        "isError": False,
    }
    records = all_records(stubs, run_id)
    stored = records[-1]
    assert (stored.sequence, stored.handle) == (outcome.sequence, outcome.handle)
    assert outcome.handle.startswith("h_")
    assert outcome.handle != handle
    assert stored.tool_result.call_id == "r1"
    assert stored.tool_result.tool == "read_tool_output"
    assert stored.tool_result.content[0].text == result_text(response)

    # The result is in the next prompt, in full (it is the current turn's), and valid.
    prompt = assemble(stubs, run_id)
    shown = history_results(prompt)["r1"]
    assert (shown.elided, shown.content[0].text) == (False, result_text(response))
    valid_anthropic(prompt.anthropic_request_json)
    valid_openai(prompt.openai_request_json)


def test_a_retried_dispatch_appends_once(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id, handle = elided_run(stubs, unique("agent"))
    first = model_calls(stubs, run_id, "r1", "read_tool_output", {"handle": handle})
    count = len(all_records(stubs, run_id))
    again = dispatch(stubs, run_id, "r1", "read_tool_output", {"handle": handle})
    assert again == first
    assert len(all_records(stubs, run_id)) == count
    # The same call id in a later assistant message is a new call.
    later = model_calls(stubs, run_id, "r1", "read_tool_output", {"handle": handle})
    assert later.outcome.sequence > first.outcome.sequence


def test_grep_and_paging_through_the_tool(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id, handle = elided_run(stubs, unique("agent"))
    grepped = model_calls(
        stubs, run_id, "g1", "read_tool_output", {"handle": handle, "grep": r"^row 39\d\d: "}
    )
    lines = result_text(grepped).split("\n")
    assert lines[0] == "3901: row 3900: value 27300"
    assert len(lines) == 100
    default = model_calls(stubs, run_id, "p1", "read_tool_output", {"handle": handle})
    text = result_text(default)
    assert text.startswith(BIG[:8000])
    assert text.endswith(f"[Characters 0 to 8000 of {len(BIG)}: continue with offset 8000.]")
    capped = model_calls(
        stubs, run_id, "p2", "read_tool_output", {"handle": handle, "limit": 10**9}
    )
    assert f"Characters 0 to 32000 of {len(BIG)}" in result_text(capped)
    # Past the end and no match: an empty result, not an error and not a note.
    past = model_calls(stubs, run_id, "p3", "read_tool_output", {"handle": handle, "offset": 10**7})
    assert (past.outcome.is_error, json.loads(past.outcome.result_json)["content"]) == (False, [])
    none = model_calls(stubs, run_id, "p4", "read_tool_output", {"handle": handle, "grep": "zzz"})
    assert (none.outcome.is_error, json.loads(none.outcome.result_json)["content"]) == (False, [])


def test_what_the_model_gets_wrong_is_a_tool_result_in_the_log(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id, handle = elided_run(stubs, unique("agent"))
    mistakes = [
        ("{not json", "the arguments are not valid JSON"),
        ("[1]", "the arguments must be a JSON object"),
        ({}, "'handle' is required"),
        ({"handle": 5}, "'handle' must be a string"),
        ({"handle": handle, "offset": "10"}, "'offset' must be an integer"),
        ({"handle": handle, "offset": True}, "'offset' must be an integer"),
        ({"handle": handle, "limit": -1}, "'limit' must not be negative"),
        ({"handle": handle, "path": "/etc/passwd"}, "unknown argument 'path'"),
        ({"handle": handle, "grep": "(oops"}, "grep missing )"),
    ]
    for index, (arguments, message) in enumerate(mistakes):
        response = model_calls(stubs, run_id, f"m{index}", "read_tool_output", arguments)
        assert response.disposition == EXECUTED
        assert response.outcome.is_error
        assert message in result_text(response)
        stored = all_records(stubs, run_id)[-1].tool_result
        assert (stored.call_id, stored.is_error) == (f"m{index}", True)
    prompt = assemble(stubs, run_id)
    valid_anthropic(prompt.anthropic_request_json)
    valid_openai(prompt.openai_request_json)


def test_a_handle_the_run_was_never_given_is_a_typed_error_and_appends_nothing(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id, _ = elided_run(stubs, unique("agent"))
    _, foreign = elided_run(stubs, unique("agent"))
    for index, bad in enumerate(["h_madeup", foreign]):
        append(stubs, run_id, assistant("", (f"x{index}", "read_tool_output", "{}")))
        count = len(all_records(stubs, run_id))
        failure = rpc_failure(
            partial(dispatch, stubs, run_id, f"x{index}", "read_tool_output", {"handle": bad})
        )
        assert failure.code == grpc.StatusCode.FAILED_PRECONDITION
        assert failure.info.reason == "INVALID_DEFERRED_HANDLE"
        assert dict(failure.info.metadata) == {"run_id": run_id, "handle": bad}
        assert len(all_records(stubs, run_id)) == count


def test_names_the_sidecar_does_not_own_belong_to_the_host(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    append(stubs, run_id, user("hi"))
    count = len(all_records(stubs, run_id))
    for name in ("bash", "load_skill", "github__create_issue"):
        response = dispatch(stubs, run_id, "c", name, {"x": 1})
        assert response.disposition == HOST_TOOL
        assert not response.HasField("outcome")
    assert len(all_records(stubs, run_id)) == count


def test_bad_dispatch_requests_are_refused(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    cases = [
        (lambda: dispatch(stubs, "run_missing", "c", "read_tool_output", {}), "RUN_NOT_FOUND"),
        (lambda: dispatch(stubs, run_id, "", "read_tool_output", {}), "FIELD_REQUIRED"),
        (lambda: dispatch(stubs, run_id, "c", "", {}), "FIELD_REQUIRED"),
        (lambda: dispatch(stubs, run_id, "c\x00", "read_tool_output", {}), "FIELD_INVALID"),
        (
            lambda: stubs.tools.DispatchToolCall(
                tool_service_pb2.DispatchToolCallRequest(run_id=run_id)
            ),
            "FIELD_REQUIRED",
        ),
    ]
    for call, reason in cases:
        assert rpc_failure(call).info.reason == reason


def test_load_skill_loads_a_body_on_demand(stubs: Stubs, unique: Callable[[str], str]) -> None:
    skills = [
        spec_pb2.Skill(name="refunds", description="Issue refunds.", body="Step 1: apologise."),
        spec_pb2.Skill(name="empty"),
    ]
    run_id = run_with(stubs, unique("agent"), skills=skills)
    append(stubs, run_id, user("refund me"))
    loaded = model_calls(stubs, run_id, "s1", "load_skill", {"name": "refunds"})
    assert (loaded.disposition, loaded.outcome.is_error) == (EXECUTED, False)
    assert result_text(loaded) == "Step 1: apologise."
    assert all_records(stubs, run_id)[-1].tool_result.tool == "load_skill"
    assert result_text(model_calls(stubs, run_id, "s2", "load_skill", {"name": "empty"})) == (
        "(This skill is empty.)"
    )
    unknown = model_calls(stubs, run_id, "s3", "load_skill", {"name": "hacking"})
    assert unknown.outcome.is_error
    assert result_text(unknown) == "load_skill: no skill named 'hacking'. Skills: refunds, empty."
    wrong = model_calls(stubs, run_id, "s4", "load_skill", {"skill": "refunds"})
    assert wrong.outcome.is_error


def test_binary_results_reach_the_model_whole(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"), thresholds=thresholds(per_result_tokens=10))
    png = b"\x89PNG\r\n\x1a\n" + bytes(500)
    append(stubs, run_id, user("draw"), assistant("", ("c1", "draw", "{}")))
    (image,) = append(stubs, run_id, result("c1", binary("image/png", png)))
    append(stubs, run_id, user("show it again"))
    assert (
        history_results(assemble(stubs, run_id))["c1"]
        .content[0]
        .text.startswith("[binary content: image/png, 508 bytes]")
    )
    response = model_calls(
        stubs, run_id, "r1", "read_tool_output", {"handle": image.handle, "grep": "x"}
    )
    assert json.loads(response.outcome.result_json)["content"] == [
        {
            "type": "text",
            "text": "[binary content: image/png, 508 bytes] offset, limit and grep do not apply "
            "to binary content.",
        },
        {"type": "image", "data": base64.b64encode(png).decode(), "mimeType": "image/png"},
    ]
    stored = all_records(stubs, run_id)[-1].tool_result.content
    assert (stored[1].binary.mime_type, stored[1].binary.data) == ("image/png", png)
    prompt = valid_anthropic(assemble(stubs, run_id).anthropic_request_json)
    last = prompt["messages"][-1]["content"][0]
    assert last["content"][1]["type"] == "image"

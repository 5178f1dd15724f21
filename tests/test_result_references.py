"""Stored results as tool arguments ({"$ref_output": …}), resolved by the sidecar before the
MCP tool is called: the project's fixture MCP server over stdio, the real server, both
databases."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from psych.sidecar.v1 import content_pb2, spec_pb2, tool_service_pb2
from psych_sidecar.domain.canonical import canonical_json
from tests.support.host import HOST_SIDECAR_OVERRIDES, Host, result_text
from tests.support.prompts import append, read, result
from tests.support.requests import all_records
from tests.support.sidecar import Stubs, rpc_failure

MIB = 1024 * 1024
# The smallest message limit: the resolved arguments' bound, which a result can pass.
SIDECAR_OVERRIDES: dict[str, Any] = {**HOST_SIDECAR_OVERRIDES, "max_message_bytes": MIB}
SIDECAR_TRANSPORTS = ["unix"]

LISTING = {"items": [{"id": f"T-{i}", "open": i % 3 == 0} for i in range(500)]}
OPEN_IDS = [item["id"] for item in LISTING["items"] if item["open"]]
META_KEY = "psych-sidecar/resolved_references"


def ref(handle: str, **fields: Any) -> dict[str, Any]:
    return {"$ref_output": {"handle": handle, **fields}}


def stored(stubs: Stubs, run_id: str, *parts: str) -> str:
    (appended,) = append(stubs, run_id, result("c", *parts))
    return appended.handle


def connected_run(host: Host, **spec: Any) -> str:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant, **spec)
    host.resolve(run_id)
    return run_id


def recorded_result_json(host: Host, run_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """The recorded answer of the host's last call: a retry of it (same call id) reads the
    log."""
    call = content_pb2.ToolCall(
        call_id=f"call-{host.calls}", name=name, arguments_json=json.dumps(arguments)
    )
    request = tool_service_pb2.DispatchToolCallRequest(run_id=run_id, call=call)
    result: dict[str, Any] = json.loads(
        host.stubs.tools.DispatchToolCall(request).outcome.result_json
    )
    return result


def test_a_query_over_a_stored_listing_is_passed_to_another_tool(host: Host, stubs: Stubs) -> None:
    run_id = connected_run(host)
    handle = stored(stubs, run_id, json.dumps(LISTING))
    written = {"text": ref(handle, query="to_string(items[?open].id)")}
    response = host.dispatch(run_id, "fx__echo", written)
    assert response.disposition == tool_service_pb2.DISPATCH_DISPOSITION_EXECUTED
    outcome = response.outcome
    assert not outcome.is_error, result_text(outcome)
    assert json.loads(result_text(outcome)) == OPEN_IDS
    # The result records what the reference resolved to, by hash and size.
    value = json.dumps(OPEN_IDS, separators=(",", ":"))
    data = canonical_json(value)
    for recorded in (
        json.loads(outcome.result_json),
        recorded_result_json(host, run_id, "fx__echo", written),
    ):
        assert recorded["_meta"][META_KEY] == [
            {
                "path": "/text",
                "handle": handle,
                "query": "to_string(items[?open].id)",
                "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data),
            }
        ]


def test_a_whole_result_and_one_part_are_passed(host: Host, stubs: Stubs) -> None:
    run_id = connected_run(host)
    handle = stored(stubs, run_id, "first part", "second part")
    whole = host.dispatch(run_id, "fx__echo", {"text": ref(handle)}).outcome
    assert result_text(whole) == "first part\nsecond part"
    part = host.dispatch(run_id, "fx__echo", {"text": ref(handle, part=1)}).outcome
    assert result_text(part) == "second part"
    # Through the meta tool too: the reference sits in `input`.
    called = host.dispatch(
        run_id, "mcp_call_tool", {"server": "fx", "tool": "echo", "input": {"text": ref(handle)}}
    ).outcome
    assert result_text(called) == "first part\nsecond part"


def test_a_structured_result_is_queried_and_passed(host: Host, stubs: Stubs) -> None:
    run_id = connected_run(host)
    structured = host.dispatch(run_id, "fx__structured", {}).outcome
    assert json.loads(structured.result_json)["structuredContent"] == {"answer": 42}
    assert read(stubs, run_id, structured.handle, query="answer").text == "42"
    echoed = host.dispatch(
        run_id, "fx__echo", {"text": ref(structured.handle, query="to_string(answer)")}
    ).outcome
    assert result_text(echoed) == "42"


def test_the_input_schema_judges_the_resolved_arguments(host: Host, stubs: Stubs) -> None:
    run_id = connected_run(host)
    handle = stored(stubs, run_id, json.dumps(LISTING))
    # A list where echo wants a string: refused by its schema, nothing run.
    outcome = host.dispatch(run_id, "fx__echo", {"text": ref(handle, query="items[].id")}).outcome
    assert outcome.is_error
    assert "Invalid arguments for fx/echo" in result_text(outcome)
    assert "is not of type 'string'" in result_text(outcome)


def test_a_reference_to_another_runs_result_is_the_typed_handle_error(
    host: Host, stubs: Stubs
) -> None:
    run_id = connected_run(host)
    other = host.run(host.tenant + "-other")
    foreign = stored(stubs, other, "another run's data")
    before = len(all_records(stubs, run_id))
    failure = rpc_failure(lambda: host.dispatch(run_id, "fx__echo", {"text": ref(foreign)}))
    assert failure.info.reason == "INVALID_DEFERRED_HANDLE"
    assert dict(failure.info.metadata) == {"run_id": run_id, "handle": foreign}
    assert "another run's data" not in failure.message
    assert len(all_records(stubs, run_id)) == before


def test_an_oversize_resolution_is_a_tool_error(host: Host, stubs: Stubs) -> None:
    run_id = connected_run(host)
    big = host.dispatch(run_id, "fx__huge_text", {"size": MIB + 1000}).outcome
    assert not big.is_error
    outcome = host.dispatch(run_id, "fx__echo", {"text": ref(big.handle)}).outcome
    assert outcome.is_error
    assert f"more than the {MIB}" in result_text(outcome)
    one_part = host.dispatch(run_id, "fx__echo", {"text": ref(big.handle, part=0)}).outcome
    assert one_part.is_error
    assert f"more than the {MIB}" in result_text(one_part)


def test_malformed_references_and_bad_queries_are_tool_errors(host: Host, stubs: Stubs) -> None:
    run_id = connected_run(host)
    handle = stored(stubs, run_id, json.dumps(LISTING))
    text = stored(stubs, run_id, "not json")
    for argument, said in (
        ({"$ref_output": {"handle": handle}, "extra": 1}, "nothing else"),
        ({"$ref_output": "h_x"}, "nothing else"),
        (ref(handle, query="items[?"), "not a valid JMESPath expression"),
        (ref(handle, query="a", part=0), "not both"),
        (ref(handle, part=7), "no part 7"),
        (ref(handle, bogus=1), "unknown field 'bogus'"),
        (ref(text, query="a"), "not JSON"),
        (ref(handle, query="items" + " | [@, @]" * 40), "larger than"),
    ):
        outcome = host.dispatch(run_id, "fx__echo", {"text": argument}).outcome
        assert outcome.is_error, argument
        assert said in result_text(outcome), (argument, result_text(outcome))


def test_the_meta_tools_tell_of_references_unless_the_spec_turns_them_off(
    host: Host, stubs: Stubs
) -> None:
    run_id = connected_run(host)
    (call_tool,) = [t for t in host.resolve(run_id).tools if t.name == "mcp_call_tool"]
    assert '{"$ref_output": {"handle": "h_…"}}' in call_tool.description
    off = host.run(
        host.tenant + "-off",
        disclosure=spec_pb2.DisclosureSettings(result_references=False),
    )
    surface = host.resolve(off)
    assert all("$ref_output" not in tool.description for tool in surface.tools)
    # Off, a reference is an argument like any other: echo's schema refuses the object.
    handle = stored(stubs, off, "data")
    outcome = host.dispatch(off, "fx__echo", {"text": ref(handle)}).outcome
    assert outcome.is_error
    assert "is not of type 'string'" in result_text(outcome)

"""The prompt budget end to end: what the model sees of each result, empty reads,
zone 1 stability, the surface pinned per turn and the context guard. The real sidecar over a
real socket, real databases, the project's real MCP test server over stdio."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable
from typing import Any

import grpc

from psych.sidecar.v1 import (
    connection_pb2,
    run_service_pb2,
    spec_pb2,
    spec_service_pb2,
    tool_service_pb2,
    turn_pb2,
    turn_service_pb2,
)
from tests.support.connections import listed
from tests.support.host import HOST_SIDECAR_OVERRIDES, Host, result_text
from tests.support.polling import wait_for
from tests.support.prompts import (
    NOON,
    anthropic_blocks,
    append,
    assistant,
    cached_prefixes,
    history_results,
    read_blocks,
    result,
    thresholds,
    valid_anthropic,
    valid_openai,
)
from tests.support.requests import all_records, publish, user
from tests.support.sidecar import Stubs, rpc_failure

SIDECAR_OVERRIDES = HOST_SIDECAR_OVERRIDES


# One transport is enough: the budget is decided behind the servicer, not at the socket.
SIDECAR_TRANSPORTS = ["unix"]


def assemble(host: Host, run_id: str, **fields: Any) -> turn_service_pb2.AssemblePromptResponse:
    fields.setdefault("now", NOON)
    fields.setdefault("model", "claude-test")
    request = turn_service_pb2.AssemblePromptRequest(run_id=run_id, **fields)
    return host.stubs.turns.AssemblePrompt(request)


def model_step(
    host: Host, run_id: str, *calls: tuple[str, dict[str, Any]]
) -> list[tool_service_pb2.DispatchToolCallResponse]:
    """One model step: an assistant message with these calls, each dispatched."""
    ids = [f"call-{host.calls + i + 1}" for i in range(len(calls))]
    append(
        host.stubs,
        run_id,
        assistant(
            "", *[(i, name, json.dumps(args)) for i, (name, args) in zip(ids, calls, strict=True)]
        ),
    )
    return [host.dispatch(run_id, name, args) for name, args in calls]


def test_a_structured_result_reaches_the_model_once(host: Host, stubs: Stubs) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(
        host.tenant,
        thresholds=thresholds(per_result_tokens=10_000, per_batch_tokens=10_000),
    )
    append(stubs, run_id, user("first"))
    with_text, _without_text, large, _image = model_step(
        host,
        run_id,
        ("fx__structured", {}),
        ("fx__structured", {"text": False}),
        ("fx__structured", {"size": 200_000}),
        ("fx__structured", {"text": False, "image": True}),
    )
    # The host gets both representations, typed, and the log keeps both.
    for response in (with_text, large):
        result = json.loads(response.outcome.result_json)
        assert result["structuredContent"]["answer"] == 42
        assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    records = {r.sequence: r for r in all_records(stubs, run_id)}
    kinds = [p.WhichOneof("kind") for p in records[with_text.outcome.sequence].tool_result.content]
    assert kinds == ["text", "json"]

    # The model sees one representation per result: the text, or the JSON when there is none.
    current = history_results(assemble(host, run_id))
    shown = {
        call_id: [p.WhichOneof("kind") for p in result.content]
        for call_id, result in current.items()
    }
    assert shown == {
        "call-1": ["text"],
        "call-2": ["json"],
        "call-3": ["text"],
        "call-4": ["binary"],
    }
    assert json.loads(current["call-2"].content[0].json) == {"answer": 42}
    body = assemble(host, run_id).anthropic_request_json
    assert body.count(b"y" * 200_000) == 1
    messages = json.dumps(json.loads(body)["messages"])
    assert messages.count("answer") == 3  # once each for calls 1 to 3, none for the image

    # Previews and sizes are those of what the model sees: the text's characters and its tail.
    append(stubs, run_id, user("second"))
    prompt = assemble(host, run_id)
    valid_anthropic(prompt.anthropic_request_json)
    valid_openai(prompt.openai_request_json)
    elided = history_results(prompt)["call-3"]
    assert elided.elided
    (part,) = elided.content
    text_length = len(json.dumps({"answer": 42, "content": "y" * 200_000}))
    assert f"{text_length} characters in full" in part.text
    assert '"}\n[Elided' in part.text  # the text block's own tail, not an escaped JSON copy
    read = host.stubs.tools.ReadToolOutput(
        tool_service_pb2.ReadToolOutputRequest(
            run_id=run_id, handle=elided.handle, offset=0, limit=0
        )
    )
    assert read.total_length == text_length
    assert not re.search(r"\\\"", read.text)


def test_past_the_end_and_no_match_are_empty_results_for_the_model(
    host: Host, stubs: Stubs
) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(
        host.tenant, thresholds=thresholds(per_result_tokens=1_000, per_batch_tokens=1_000)
    )
    append(stubs, run_id, user("first"))
    (big,) = model_step(host, run_id, ("fx__huge_text", {"size": 50_000}))
    append(stubs, run_id, user("second"))
    handle = history_results(assemble(host, run_id))["call-1"].handle
    assert handle == big.outcome.handle
    past, none = model_step(
        host,
        run_id,
        ("read_tool_output", {"handle": handle, "offset": 10**7}),
        ("read_tool_output", {"handle": handle, "grep": "no such line"}),
    )
    for response in (past, none):
        assert not response.outcome.is_error
        assert json.loads(response.outcome.result_json)["content"] == []
    records = {r.sequence: r for r in all_records(stubs, run_id)}
    for response in (past, none):
        assert list(records[response.outcome.sequence].tool_result.content) == []
    prompt = assemble(host, run_id)
    shown = history_results(prompt)
    assert [list(shown[c].content) for c in ("call-2", "call-3")] == [[], []]
    anthropic = valid_anthropic(prompt.anthropic_request_json)
    valid_openai(prompt.openai_request_json)
    results = [
        block
        for message in anthropic["messages"]
        for block in message["content"]
        if block["type"] == "tool_result" and block["tool_use_id"] in ("call-2", "call-3")
    ]
    results[-1].pop("cache_control", None)
    assert results == [
        {"type": "tool_result", "tool_use_id": "call-2"},
        {"type": "tool_result", "tool_use_id": "call-3"},
    ]


def test_an_empty_model_is_left_out_of_both_bodies(host: Host, stubs: Stubs) -> None:
    run_id = host.run(host.tenant)
    append(stubs, run_id, user("hello"))
    prompt = assemble(host, run_id, model="")
    anthropic = json.loads(prompt.anthropic_request_json)
    openai = json.loads(prompt.openai_request_json)
    assert "model" not in anthropic
    assert "model" not in openai
    # With the host's model set, each is a valid request.
    valid_anthropic(json.dumps({"model": "claude-test", **anthropic}).encode())
    valid_openai(json.dumps({"model": "gpt-test", **openai}).encode())
    named = assemble(host, run_id, model="claude-test")
    assert json.loads(named.anthropic_request_json)["model"] == "claude-test"


def zones(response: turn_service_pb2.AssemblePromptResponse) -> dict[int, str]:
    return {digest.zone: digest.sha256 for digest in response.zones}


def transient_text(response: turn_service_pb2.AssemblePromptResponse) -> str:
    return "".join(part.content.text for part in response.prompt.transient.parts)


def test_a_flapping_server_leaves_zone_1_unchanged(host: Host, stubs: Stubs) -> None:
    host.connect("fx", "--tools", "0", preload=False, description="Deferred fixture.")
    host.connect("dx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant, instructions="Be brief.")
    append(stubs, run_id, user("hello"))
    before = assemble(host, run_id)
    roster = before.prompt.dynamic_tail
    assert roster.startswith("# Tool servers\n\n")
    assert "fx (deferred, 17 tools): Deferred fixture." in roster
    assert [s.title for s in before.prompt.static_sections] == ["Instructions"]
    assert "Tool server status" not in transient_text(before)

    def state(name: str) -> int:
        return listed(stubs, host.tenant)[name].state

    pid = int(result_text(host.call(run_id, "fx", "pid")))
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: state("fx") == connection_pb2.CONNECTION_STATE_UNREACHABLE, "fx down")
    down = assemble(host, run_id)
    assert (
        zones(down)[turn_pb2.PROMPT_ZONE_STATIC_SYSTEM]
        == (zones(before)[turn_pb2.PROMPT_ZONE_STATIC_SYSTEM])
    )
    assert down.prompt.dynamic_tail == roster
    assert "fx is UNREACHABLE: its calls fail until it reconnects." in transient_text(down)
    anthropic = valid_anthropic(down.anthropic_request_json)
    assert "UNREACHABLE" not in json.dumps(anthropic["system"])
    assert "UNREACHABLE" in json.dumps(anthropic["messages"][-1])

    wait_for(lambda: state("fx") == connection_pb2.CONNECTION_STATE_CONNECTED, "fx back")
    up = assemble(host, run_id)
    assert (
        zones(up)[turn_pb2.PROMPT_ZONE_STATIC_SYSTEM]
        == (zones(before)[turn_pb2.PROMPT_ZONE_STATIC_SYSTEM])
    )
    assert (
        zones(up)[turn_pb2.PROMPT_ZONE_DYNAMIC_TAIL]
        == (zones(before)[turn_pb2.PROMPT_ZONE_DYNAMIC_TAIL])
    )
    assert "Tool server status" not in transient_text(up)


def test_the_surface_is_pinned_per_turn_and_calls_are_rechecked_at_once(
    host: Host, stubs: Stubs
) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant)
    append(stubs, run_id, user("first"))
    first = assemble(host, run_id)
    surface = host.resolve(run_id)
    assert "fx__echo" in [tool.name for tool in surface.tools]
    assert not model_step(host, run_id, ("fx__echo", {"text": "one"}))[0].outcome.is_error

    # Mid-turn: a server connected, and echo revoked on fx.
    host.connect("gx", "--tools", "0", preload=True)
    host.connect("fx", "--tools", "0", preload=True, deny_tools=["echo"])
    (refused,) = model_step(host, run_id, ("fx__echo", {"text": "two"}))
    assert refused.outcome.is_error  # the executor re-checks at call time
    assert "no tool 'echo' on fx that you may use" in result_text(refused.outcome)
    same = assemble(host, run_id)
    assert host.resolve(run_id) == surface
    for zone in (turn_pb2.PROMPT_ZONE_STATIC_SYSTEM, turn_pb2.PROMPT_ZONE_DYNAMIC_TAIL):
        assert zones(same)[zone] == zones(first)[zone]
    assert (
        json.loads(same.anthropic_request_json)["tools"]
        == (json.loads(first.anthropic_request_json)["tools"])
    )

    # The next turn sees both changes.
    append(stubs, run_id, user("second"))
    nxt = host.resolve(run_id)
    names = [tool.name for tool in nxt.tools]
    assert "fx__echo" not in names
    assert "gx__echo" in names
    assert [line.server for line in nxt.servers] == ["fx", "gx"]
    prompt = assemble(host, run_id)
    assert (
        zones(prompt)[turn_pb2.PROMPT_ZONE_STATIC_SYSTEM]
        != (zones(first)[turn_pb2.PROMPT_ZONE_STATIC_SYSTEM])
    )
    assert "gx (direct" in prompt.prompt.dynamic_tail


def test_a_5_mb_current_turn_result_is_elided_to_fit_a_200k_window(
    host: Host, stubs: Stubs
) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant)  # the default budget: a 200,000-token window
    append(stubs, run_id, user("Read the big file."))
    big, _small = model_step(
        host,
        run_id,
        ("fx__huge_text", {"size": 5_000_000}),
        ("fx__echo", {"text": "small and kept"}),
    )
    prompt = assemble(host, run_id)
    guard = prompt.context_guard
    assert (guard.context_window_tokens, guard.output_reserve_tokens) == (200_000, 4096)
    assert guard.full_estimated_tokens > 1_250_000
    assert guard.estimated_tokens <= 200_000 - 4096
    (elided,) = guard.elided
    assert (elided.call_id, elided.handle) == ("call-1", big.outcome.handle)
    assert elided.full_tokens == 1_250_000
    assert elided.view_tokens < 1_000
    assert "over the budget of 195904" in guard.reason
    results = history_results(prompt)
    shown = results["call-1"]
    assert shown.elided
    assert shown.handle == big.outcome.handle
    (part,) = shown.content
    assert part.text.startswith("x" * 1000 + "\n[... 4998500 characters omitted ...]\n")
    assert f'read_tool_output(handle="{big.outcome.handle}")' in part.text
    assert not results["call-2"].elided
    assert results["call-2"].content[0].text == "small and kept"
    body = valid_anthropic(prompt.anthropic_request_json)
    valid_openai(prompt.openai_request_json)
    assert len(prompt.anthropic_request_json) // 4 <= 200_000
    assert body["max_tokens"] == 4096
    # The log still holds every byte.
    assert (
        host.stubs.tools.ReadToolOutput(
            tool_service_pb2.ReadToolOutputRequest(
                run_id=run_id, handle=big.outcome.handle, offset=4_999_990
            )
        ).text
        == "x" * 10
    )


def test_the_guard_changes_nothing_when_the_prompt_fits_and_is_overridable(
    host: Host, stubs: Stubs
) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant, instructions="Be brief. " * 2000)
    append(stubs, run_id, user("Read it."))
    (medium,) = model_step(host, run_id, ("fx__huge_text", {"size": 400_000}))
    fits = assemble(host, run_id)
    assert list(fits.context_guard.elided) == []
    assert fits.context_guard.reason == ""
    assert fits.context_guard.estimated_tokens == fits.context_guard.full_estimated_tokens
    assert history_results(fits)["call-1"].content[0].text == "x" * 400_000

    # The same Run with a smaller window for this call: the result is elided to fit.
    smaller = spec_pb2.ContextBudget(context_window_tokens=50_000, output_reserve_tokens=1_000)
    guarded = assemble(host, run_id, context_budget=smaller)
    assert [g.handle for g in guarded.context_guard.elided] == [medium.outcome.handle]
    assert guarded.context_guard.estimated_tokens <= 49_000
    # Zones 1 and 2 do not depend on the guard.
    for zone in (turn_pb2.PROMPT_ZONE_STATIC_SYSTEM, turn_pb2.PROMPT_ZONE_DYNAMIC_TAIL):
        assert zones(guarded)[zone] == zones(fits)[zone]

    # A window the rest of the prompt cannot fit even with every result elided: typed error.
    tiny = spec_pb2.ContextBudget(context_window_tokens=5_000, output_reserve_tokens=1_000)
    failure = rpc_failure(lambda: assemble(host, run_id, context_budget=tiny))
    assert failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert failure.info.reason == "CONTEXT_BUDGET_EXCEEDED"
    metadata = failure.info.metadata
    assert (metadata["context_window_tokens"], metadata["output_reserve_tokens"]) == (
        "5000",
        "1000",
    )
    assert metadata["budget_tokens"] == "4000"
    assert int(metadata["estimated_tokens"]) > 4000
    assert int(metadata["full_estimated_tokens"]) > 100_000

    bad = spec_pb2.ContextBudget(context_window_tokens=1_000, output_reserve_tokens=1_000)
    failure = rpc_failure(lambda: assemble(host, run_id, context_budget=bad))
    assert failure.info.reason == "FIELD_INVALID"


def test_an_optional_cap_elides_a_large_current_turn_result_from_its_first_step(
    host: Host, stubs: Stubs
) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    capped_spec = spec_pb2.ContextBudget(current_turn_result_tokens=25_000)
    run_id = host.run(host.tenant, context_budget=capped_spec)
    append(stubs, run_id, user("Read it."))
    big, _small = model_step(
        host, run_id, ("fx__huge_text", {"size": 200_000}), ("fx__echo", {"text": "kept"})
    )
    first = assemble(host, run_id)
    shown = history_results(first)
    # 50,000 estimated tokens, over the cap: the usual view and handle, well inside the window.
    assert shown["call-1"].elided
    assert shown["call-1"].handle == big.outcome.handle
    assert f'read_tool_output(handle="{big.outcome.handle}")' in shown["call-1"].content[0].text
    assert not shown["call-2"].elided
    assert list(first.context_guard.elided) == []
    valid_anthropic(first.anthropic_request_json)
    # The next step shows it the same, byte for byte.
    model_step(host, run_id, ("fx__echo", {"text": "again"}))
    second = assemble(host, run_id)
    assert history_results(second)["call-1"] == shown["call-1"]
    first_blocks, _ = anthropic_blocks(first.anthropic_request_json)
    second_blocks, _ = anthropic_blocks(second.anthropic_request_json)
    assert second_blocks[: len(first_blocks) - 1] == first_blocks[:-1]

    # Unset by default (the spec's behaviour: in full); a call may set it.
    plain = host.run(host.tenant + "-plain")
    append(stubs, plain, user("Read it."))
    model_step(host, plain, ("fx__huge_text", {"size": 200_000}))
    ((full),) = history_results(assemble(host, plain)).values()
    assert not full.elided
    per_call = assemble(host, plain, context_budget=capped_spec)
    ((view),) = history_results(per_call).values()
    assert view.elided
    zero = spec_pb2.ContextBudget(current_turn_result_tokens=0)
    failure = rpc_failure(lambda: assemble(host, plain, context_budget=zero))
    assert failure.info.reason == "FIELD_INVALID"
    assert failure.info.metadata["field"] == "context_budget.current_turn_result_tokens"


def test_the_openai_body_carries_a_prompt_cache_key_per_tenant_and_spec(
    host: Host, stubs: Stubs
) -> None:
    """OpenAI routes requests sharing a prefix to one cache when they share a key: every call
    of a tenant's Runs of one Spec version has the same one, naming neither."""
    first = host.run(host.tenant)
    second = stubs.runs.CreateRun(
        run_service_pb2.CreateRunRequest(tenant=host.tenant, spec_name=host.tenant, spec_version=1)
    ).run.run_id
    other_tenant = stubs.runs.CreateRun(
        run_service_pb2.CreateRunRequest(
            tenant=host.tenant + "-b", spec_name=host.tenant, spec_version=1
        )
    ).run.run_id
    keys = []
    for run_id in (first, second, other_tenant):
        append(stubs, run_id, user("Hello."))
        body = valid_openai(assemble(host, run_id).openai_request_json)
        keys.append(body["prompt_cache_key"])
    assert keys[0] == keys[1] != keys[2]
    assert re.fullmatch(r"psych-[0-9a-f]{32}", keys[0])
    assert host.tenant not in keys[0]
    assert list(body)[:3] == ["model", "max_completion_tokens", "prompt_cache_key"]


def test_a_spec_carries_its_context_budget(stubs: Stubs, unique: Callable[[str], str]) -> None:
    name = unique("agent")
    budget = spec_pb2.ContextBudget(context_window_tokens=128_000, output_reserve_tokens=8_000)
    published = publish(stubs, name, context_budget=budget)
    assert published.context_budget == budget
    fetched = stubs.specs.GetSpec(spec_service_pb2.GetSpecRequest(name=name, version=1)).spec
    assert fetched.context_budget == budget
    wrong = spec_pb2.ContextBudget(context_window_tokens=100, output_reserve_tokens=200)
    failure = rpc_failure(lambda: publish(stubs, unique("agent"), context_budget=wrong))
    assert failure.info.reason == "FIELD_INVALID"
    assert failure.info.metadata["field"] == "spec.context_budget.output_reserve_tokens"


def test_the_first_call_of_a_turn_reads_the_previous_turns_prefix(host: Host, stubs: Stubs) -> None:
    run_id = host.run(host.tenant, instructions="Work through the files.")
    append(stubs, run_id, user("first"))
    cache: set[tuple[str, ...]] = set()
    bodies = []
    for step in range(16):
        body = assemble(host, run_id).anthropic_request_json
        valid_anthropic(body)
        bodies.append(body)
        cache |= cached_prefixes(body)
        content = "z" * 40_000 if step == 6 else f"file {step}"
        append(
            stubs,
            run_id,
            assistant(f"step {step}", (f"t{step}", "read_file", "{}")),
            result(f"t{step}", content),
        )
    bodies.append(assemble(host, run_id).anthropic_request_json)
    cache |= cached_prefixes(bodies[-1])
    append(stubs, run_id, assistant("Done."), user("second"))

    nxt = assemble(host, run_id).anthropic_request_json
    valid_anthropic(nxt)
    blocks, breakpoints = anthropic_blocks(nxt)
    # Zone 1 (no zone 2 here: no servers, no host tail), the read point, the history's end.
    assert len(breakpoints) == 3
    # Step 6's result is elided now; the call that produced step 6's assistant message
    # cached everything before it, and the read point lands exactly there.
    assert history_results(assemble(host, run_id))["t6"].elided
    step_6_blocks, step_6_breakpoints = anthropic_blocks(bodies[6])
    produced_step_6 = step_6_blocks[: step_6_breakpoints[-1]]  # up to its history's end
    assert blocks[: len(produced_step_6)] == produced_step_6
    assert len(produced_step_6) in breakpoints
    read = read_blocks(nxt, cache)
    assert read == len(produced_step_6)
    assert len(blocks) - read > 20  # beyond the lookback of the last breakpoint alone
    # Within the turn, each call reads the whole of the previous call's prefix.
    cache |= cached_prefixes(nxt)
    append(stubs, run_id, assistant("again", ("t99", "read_file", "{}")), result("t99", "x"))
    step_two = assemble(host, run_id).anthropic_request_json
    assert read_blocks(step_two, cache) == len(blocks) - 1  # all but the transient text

"""AssemblePrompt over the real server, on both databases: zones, the clock, the provider
bodies (validated against the official SDKs' request types) and cache breakpoints."""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypedDict

import grpc
from google.protobuf import timestamp_pb2

from psych.sidecar.v1 import content_pb2, spec_pb2, turn_pb2, turn_service_pb2
from tests.support.prompts import (
    NOON,
    append,
    assemble,
    assistant,
    binary,
    history_results,
    result,
    run_with,
    valid_anthropic,
    valid_gemini,
    valid_openai,
    valid_openai_responses,
)
from tests.support.requests import user
from tests.support.sidecar import Stubs, rpc_failure

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg=="
)


class SpecFields(TypedDict):
    """The Spec fields these tests publish (run_with passes them on to spec_pb2.Spec)."""

    instructions: str
    skills: list[spec_pb2.Skill]
    subagents: list[spec_pb2.Subagent]
    capability_notes: list[str]


SPEC = SpecFields(
    instructions="You help customers.",
    skills=[
        spec_pb2.Skill(name="refunds", description="Issue a refund.", body="SECRET BODY"),
        spec_pb2.Skill(name="apology"),
    ],
    subagents=[spec_pb2.Subagent(name="researcher", description="Digs through docs.")],
    capability_notes=["You can read files.", "You cannot browse."],
)


def test_zone_one_holds_the_spec_sections_in_order_and_no_skill_bodies(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), **SPEC)
    append(stubs, run_id, user("hello"))
    prompt = assemble(stubs, run_id).prompt
    assert [(s.title, s.text) for s in prompt.static_sections] == [
        ("Instructions", "You help customers."),
        (
            "Skills",
            "- refunds: Issue a refund.\n- apology\n\n"
            "Load a skill's full text with the load_skill tool before following it.",
        ),
        ("Subagents", "- researcher: Digs through docs."),
        ("Capabilities", "You can read files.\n\nYou cannot browse."),
    ]
    tools = list(prompt.tools.tools)
    assert [t.name for t in tools] == ["load_skill", "read_tool_output"]
    assert [t.kind for t in tools] == [
        turn_pb2.EXPOSED_TOOL_KIND_LOAD_SKILL,
        turn_pb2.EXPOSED_TOOL_KIND_READ_TOOL_OUTPUT,
    ]
    for tool in tools:
        schema = tool.input_schema_json
        assert (
            schema == json.dumps(json.loads(schema), sort_keys=True, separators=(",", ":")).encode()
        )
    assert json.loads(tools[0].input_schema_json)["properties"]["name"]["enum"] == [
        "apology",
        "refunds",
    ]
    assert "SECRET BODY" not in str(prompt)


def test_a_spec_without_skills_offers_only_read_tool_output(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    append(stubs, run_id, user("hello"))
    response = assemble(stubs, run_id)
    assert [t.name for t in response.prompt.tools.tools] == ["read_tool_output"]
    assert list(response.prompt.static_sections) == []
    body = valid_anthropic(response.anthropic_request_json)
    assert "system" not in body
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    valid_openai(response.openai_request_json)


def test_the_clock_and_the_note_reach_only_zone_four(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), **SPEC)
    append(stubs, run_id, user("hello"), assistant("hi"), user("what day is it?"))
    first = assemble(stubs, run_id, dynamic_tail="Memory: likes tea.")
    later = assemble(
        stubs,
        run_id,
        dynamic_tail="Memory: likes tea.",
        now=timestamp_pb2.Timestamp(seconds=NOON.seconds + 86_400 * 40 + 61),
        transient_note="Be brief.",
    )
    assert [z.zone for z in first.zones] == [1, 2, 3, 4]
    assert [(z.byte_length, z.sha256) for z in first.zones[:3]] == [
        (z.byte_length, z.sha256) for z in later.zones[:3]
    ]
    assert first.zones[3].sha256 != later.zones[3].sha256
    assert all(len(z.sha256) == 64 and z.byte_length > 0 for z in first.zones)
    assert first.prompt.transient.role == turn_pb2.PROMPT_ROLE_USER
    assert first.prompt.transient.parts[0].content.text == (
        "Current date and time: Tuesday, 2026-12-01T12:00:00Z"
    )
    assert later.prompt.transient.parts[0].content.text == (
        "Current date and time: Sunday, 2027-01-10T12:01:01Z\n\nBe brief."
    )
    for response in (first, later):
        text = response.prompt.transient.parts[0].content.text
        for body in (response.anthropic_request_json, response.openai_request_json):
            assert body.count(text.split("\n")[0].encode()) == 1
    # Everything but the transient text is byte-identical in both provider bodies.
    assert (
        first.anthropic_request_json.replace(
            b"Tuesday, 2026-12-01T12:00:00Z", b"Sunday, 2027-01-10T12:01:01Z\\n\\nBe brief."
        )
        == later.anthropic_request_json
    )


def test_unset_now_uses_the_sidecar_clock(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    append(stubs, run_id, user("hello"))
    before = time.gmtime()
    text = assemble(stubs, run_id, now=None).prompt.transient.parts[0].content.text
    assert (
        time.strftime("%Y-%m-%d", before) in text
        or time.strftime("%Y-%m-%d", time.gmtime()) in text
    )


def test_dynamic_tail_changes_only_zone_two(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"), **SPEC)
    append(stubs, run_id, user("hello"))
    one = assemble(stubs, run_id, dynamic_tail="Memory: A")
    two = assemble(stubs, run_id, dynamic_tail="Memory: B")
    changed = [a.zone for a, b in zip(one.zones, two.zones, strict=True) if a.sha256 != b.sha256]
    assert changed == [turn_pb2.PROMPT_ZONE_DYNAMIC_TAIL]
    assert two.prompt.dynamic_tail == "Memory: B"
    system = valid_anthropic(two.anthropic_request_json)["system"]
    assert [b["text"] for b in system][1] == "Memory: B"
    assert system[0]["text"].startswith("# Instructions\n\nYou help customers.\n\n# Skills\n\n")


def test_bodies_are_valid_with_every_kind_of_content_and_a_note_after_tool_results(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), **SPEC)
    append(
        stubs,
        run_id,
        user("Show me the chart and the data."),
        assistant(
            "Fetching.",
            ("c1", "get_chart", '{"id": 7}'),
            ("c2", "get_data", "{not json"),
            ("c3", "get_pdf", ""),
            ("c4", "crash", "[1, 2]"),
        ),
        result("c1", "chart attached", binary("image/png", PNG)),
        result("c2", content_pb2.ContentPart(json=b'{"rows": [1, 2.50]}')),
        result(
            "c3", binary("application/pdf", b"%PDF-1.4 tiny"), binary("audio/x-raw", b"\x00\x01")
        ),
        result("c4", "Traceback: boom", is_error=True),
    )
    response = assemble(stubs, run_id, transient_note="Answer in French.", max_tokens=1234)
    anthropic = valid_anthropic(response.anthropic_request_json)
    openai = valid_openai(response.openai_request_json)
    responses = valid_openai_responses(response.openai_responses_request_json)
    gemini = valid_gemini(response.gemini_request_json)
    assert gemini["generationConfig"] == {"maxOutputTokens": 1234}
    replies = {
        p["functionResponse"]["name"]: p["functionResponse"]["response"]
        for c in gemini["contents"]
        for p in c["parts"]
        if "functionResponse" in p
    }
    assert replies["crash"] == {"error": "Traceback: boom"}
    assert replies["get_chart"] == {
        "output": "chart attached\n[binary content: image/png, 70 bytes]"
    }
    calls = [p for c in gemini["contents"] for p in c["parts"] if "functionCall" in p]
    assert [p["functionCall"]["args"] for p in calls] == [
        {"id": 7},
        {"invalid_arguments_json": "{not json"},
        {},
        {"invalid_arguments_json": "[1, 2]"},
    ]
    # No block of Gemini's own spells them: the first carries Gemini's placeholder signature.
    assert [p.get("thoughtSignature") for p in calls] == [
        "skip_thought_signature_validator",
        None,
        None,
        None,
    ]
    assert gemini["contents"][-1]["parts"][-1]["text"].endswith("Answer in French.")
    assert (responses["model"], responses["max_output_tokens"]) == ("claude-test", 1234)
    outputs = {
        i["call_id"]: i["output"] for i in responses["input"] if i["type"] == "function_call_output"
    }
    assert outputs["c1"] == "chart attached\n[binary content: image/png, 70 bytes]"
    assert outputs["c4"] == "[error] Traceback: boom"
    arguments = [i["arguments"] for i in responses["input"] if i["type"] == "function_call"]
    assert arguments == ['{"id": 7}', "{not json", "{}", "[1, 2]"]
    assert (anthropic["model"], anthropic["max_tokens"]) == ("claude-test", 1234)
    assert (openai["model"], openai["max_completion_tokens"]) == ("claude-test", 1234)

    last = anthropic["messages"][-1]["content"]
    assert [b["type"] for b in last] == ["tool_result"] * 4 + ["text"]
    assert last[-1]["text"].endswith("Answer in French.")
    assert "cache_control" in last[-2]
    assert "cache_control" not in last[-1]
    chart = last[0]["content"]
    assert chart[1] == {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(PNG).decode(),
        },
    }
    assert last[1]["content"] == [{"type": "text", "text": '{"rows": [1, 2.50]}'}]
    assert last[2]["content"][0]["type"] == "document"
    assert last[2]["content"][1] == {
        "type": "text",
        "text": "[binary content: audio/x-raw, 2 bytes]",
    }
    assert last[3]["is_error"] is True
    tool_uses = [b for b in anthropic["messages"][-2]["content"] if b["type"] == "tool_use"]
    assert [u["input"] for u in tool_uses] == [
        {"id": 7},
        {"invalid_arguments_json": "{not json"},
        {},
        {"invalid_arguments_json": "[1, 2]"},
    ]

    roles = [m["role"] for m in openai["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "tool", "tool", "user"]
    tools = {m["tool_call_id"]: m["content"] for m in openai["messages"] if m["role"] == "tool"}
    assert tools["c1"] == "chart attached\n[binary content: image/png, 70 bytes]"
    assert tools["c4"] == "[error] Traceback: boom"
    assert openai["messages"][-1]["content"][0]["text"].endswith("Answer in French.")


def test_cache_breakpoints_close_zones_one_two_and_three(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), **SPEC)
    append(stubs, run_id, user("hello"), assistant("hi there"))
    body = valid_anthropic(assemble(stubs, run_id, dynamic_tail="Memory").anthropic_request_json)
    assert list(body) == ["model", "max_tokens", "tools", "system", "messages"]
    assert [("cache_control" in t) for t in body["tools"]] == [False, False]
    assert [b.get("cache_control") for b in body["system"]] == [{"type": "ephemeral"}] * 2
    assert body["messages"][-2] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "hi there", "cache_control": {"type": "ephemeral"}}],
    }
    assert body["messages"][-1]["role"] == "user"
    assert "cache_control" not in body["messages"][-1]["content"][0]


def test_a_call_without_a_result_and_a_result_without_a_call_stay_valid(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    append(
        stubs,
        run_id,
        result("early", "a result before anything was asked"),
        user("go"),
        assistant("", ("lost", "slow_tool", "{}"), ("kept", "fast_tool", "{}")),
        result("kept", "fast"),
        result("kept", "fast again"),
        user("never mind"),
    )
    response = assemble(stubs, run_id)
    results = history_results(response)
    assert results["lost"].is_error
    assert not results["lost"].handle
    assert results["lost"].content[0].text == "No result was recorded for this tool call."
    anthropic = valid_anthropic(response.anthropic_request_json)
    valid_openai(response.openai_request_json)
    assert anthropic["messages"][0]["content"][0]["text"] == (
        "[Result of tool call early]\na result before anything was asked"
    )
    texts = [b.get("text", "") for m in anthropic["messages"] for b in m["content"]]
    assert "[Result of tool call kept]\nfast again" in texts


def test_assembly_is_deterministic(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"), **SPEC)
    append(stubs, run_id, user("q"), assistant("", ("c1", "t", "{}")), result("c1", "r" * 5000))
    append(stubs, run_id, user("again"))
    first, second = assemble(stubs, run_id), assemble(stubs, run_id)
    assert first.SerializeToString(deterministic=True) == second.SerializeToString(
        deterministic=True
    )


def test_bad_requests_are_refused(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    missing = rpc_failure(lambda: assemble(stubs, "run_missing"))
    assert (missing.code, missing.info.reason) == (grpc.StatusCode.NOT_FOUND, "RUN_NOT_FOUND")
    negative = rpc_failure(lambda: assemble(stubs, run_id, max_tokens=-1))
    assert (negative.info.reason, negative.info.metadata["field"]) == (
        "FIELD_INVALID",
        "max_tokens",
    )
    empty = rpc_failure(lambda: assemble(stubs, ""))
    assert (empty.info.reason, empty.info.metadata["field"]) == ("FIELD_REQUIRED", "run_id")


BODY_FIELDS = {
    turn_service_pb2.BODY_FORMAT_ANTHROPIC_MESSAGES: "anthropic_request_json",
    turn_service_pb2.BODY_FORMAT_OPENAI_CHAT_COMPLETIONS: "openai_request_json",
    turn_service_pb2.BODY_FORMAT_OPENAI_RESPONSES: "openai_responses_request_json",
    turn_service_pb2.BODY_FORMAT_GEMINI_GENERATE_CONTENT: "gemini_request_json",
}


def test_only_the_bodies_asked_for_are_built(stubs: Stubs, unique: Callable[[str], str]) -> None:
    """Each body asked for alone is the very body of a call that asks for none (all four),
    the others empty; the prompt and its zones are the same either way."""
    run_id = run_with(stubs, unique("agent"), **SPEC)
    append(stubs, run_id, user("q"), assistant("", ("c1", "t", "{}")), result("c1", "r" * 5000))
    append(stubs, run_id, user("again"))
    every = assemble(stubs, run_id, preview=True)
    assert all(getattr(every, field) for field in BODY_FIELDS.values())
    for body_format, field in BODY_FIELDS.items():
        one = assemble(stubs, run_id, preview=True, bodies=[body_format, body_format])
        assert getattr(one, field) == getattr(every, field)
        assert [name for name in BODY_FIELDS.values() if getattr(one, name)] == [field]
        assert one.prompt == every.prompt
        assert list(one.zones) == list(every.zones)
    two = assemble(
        stubs,
        run_id,
        preview=True,
        bodies=[
            turn_service_pb2.BODY_FORMAT_GEMINI_GENERATE_CONTENT,
            turn_service_pb2.BODY_FORMAT_ANTHROPIC_MESSAGES,
        ],
    )
    assert (two.anthropic_request_json, two.gemini_request_json) == (
        every.anthropic_request_json,
        every.gemini_request_json,
    )
    assert not two.openai_request_json
    assert not two.openai_responses_request_json


def test_a_body_format_the_sidecar_does_not_build_is_refused(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    append(stubs, run_id, user("q"))
    for bodies, field in (
        ([turn_service_pb2.BODY_FORMAT_UNSPECIFIED], "bodies[0]"),
        ([turn_service_pb2.BODY_FORMAT_OPENAI_RESPONSES, 99], "bodies[1]"),
    ):
        failure = rpc_failure(partial(assemble, stubs, run_id, bodies=bodies))
        assert (failure.code, failure.info.reason, failure.info.metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_INVALID",
            field,
        )


def _breakpoints(body: dict[str, Any]) -> list[str]:
    """Where the Responses body's explicit cache breakpoints are: each marked block's text."""
    marked = []
    for item in body["input"]:
        blocks = item.get("content") if item["type"] == "message" else item.get("output")
        for block in blocks if isinstance(blocks, list) else []:
            if "prompt_cache_breakpoint" in block:
                assert block["prompt_cache_breakpoint"] == {"mode": "explicit"}
                marked.append(block["text"])
    return marked


def test_the_responses_body_marks_each_calls_history_end_on_models_that_take_breakpoints(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    """On gpt-5.6 and later: zone 2's end and the end of every call's history carry an
    explicit breakpoint, and a marked block stays marked, so each call's body (less its
    transient item) is a byte prefix of the next. Other models get none."""
    run_id = run_with(stubs, unique("agent"), **SPEC)
    append(stubs, run_id, user("q"))
    tail = "Memory: short answers."
    bodies = []
    for step, call_id in enumerate(("c1", "c2")):
        response = assemble(stubs, run_id, model="gpt-5.6", dynamic_tail=tail)
        bodies.append(response.openai_responses_request_json)
        append(stubs, run_id, assistant("", (call_id, "t", "{}")), result(call_id, f"r{step}"))
    final = assemble(stubs, run_id, model="gpt-5.6", dynamic_tail=tail)
    bodies.append(final.openai_responses_request_json)
    parsed = valid_openai_responses(bodies[-1])
    assert _breakpoints(parsed) == [tail, "q", "r0", "r1"]
    assert parsed["input"][0]["content"][0]["text"] == tail
    for earlier, later in itertools.pairwise(bodies):
        cut = earlier.rindex(b',{"type":"message","role":"user"')
        assert later.startswith(earlier[:cut])
    for model in ("gpt-5.5", "gpt-5", "gpt-4o", "o3", "claude-test", ""):
        body = json.loads(assemble(stubs, run_id, model=model).openai_responses_request_json)
        assert _breakpoints(body) == []
        assert b"prompt_cache_breakpoint" not in json.dumps(body).encode()
    for model in ("gpt-5.6-mini", "gpt-5.10", "gpt-6"):
        body = json.loads(assemble(stubs, run_id, model=model).openai_responses_request_json)
        assert _breakpoints(body) == ["q", "r0", "r1"]

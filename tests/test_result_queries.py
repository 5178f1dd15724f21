"""JMESPath queries over stored results, over the real server: through ReadToolOutput (typed
errors) and through the model's read_tool_output (tool errors), on both databases."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

import grpc

from psych.sidecar.v1 import content_pb2
from tests.support.prompts import (
    append,
    assemble,
    assistant,
    binary,
    dispatch,
    history_results,
    read,
    result,
    run_with,
    thresholds,
)
from tests.support.requests import user
from tests.support.sidecar import Stubs, rpc_failure

TICKETS = {
    "items": [
        {"id": f"T-{i}", "status": ("open", "closed")[i % 2], "assignee": ("Ana", "Bo")[i % 3 > 0]}
        for i in range(3000)
    ]
}
OPEN_FOR_ANA = [
    t["id"] for t in TICKETS["items"] if t["status"] == "open" and t["assignee"] == "Ana"
]


def stored(stubs: Stubs, run_id: str, *parts: content_pb2.ContentPart | str) -> str:
    (appended,) = append(stubs, run_id, result("c", *parts))
    return appended.handle


def as_json_part(value: Any) -> content_pb2.ContentPart:
    return content_pb2.ContentPart(json=json.dumps(value).encode())


def model_reads(stubs: Stubs, run_id: str, call_id: str, arguments: Any) -> tuple[bool, str]:
    """The model's read_tool_output call: (is_error, its text)."""
    append(stubs, run_id, assistant("", (call_id, "read_tool_output", json.dumps(arguments))))
    outcome = dispatch(stubs, run_id, call_id, "read_tool_output", arguments).outcome
    content = json.loads(outcome.result_json)["content"]
    return outcome.is_error, "".join(block["text"] for block in content)


def test_a_query_filters_projects_and_counts_a_json_result(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    for handle in (
        stored(stubs, run_id, json.dumps(TICKETS, indent=2)),  # JSON sent as text
        stored(stubs, run_id, as_json_part(TICKETS)),  # a JSON part
    ):
        got = read(stubs, run_id, handle, query="items[?status=='open' && assignee=='Ana'].id")
        assert json.loads(got.text) == OPEN_FOR_ANA
        assert (got.total_length, got.next_offset) == (len(got.text), len(got.text))
        assert read(stubs, run_id, handle, query="length(items)").text == "3000"
        assert json.loads(read(stubs, run_id, handle, query="items[:2].[id, status]").text) == [
            ["T-0", "open"],
            ["T-1", "closed"],
        ]
        assert read(stubs, run_id, handle, query="nothing.here").text == "null"


def test_a_query_result_pages_by_characters(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    handle = stored(stubs, run_id, as_json_part(TICKETS))
    whole = read(stubs, run_id, handle, query="items[].id").text
    pages, offset = [], 0
    while True:
        got = read(stubs, run_id, handle, query="items[].id", offset=offset, limit=1000)
        assert got.total_length == len(whole)
        if not got.text:
            assert got.next_offset == len(whole)
            break
        pages.append(got.text)
        offset = got.next_offset
    assert "".join(pages) == whole
    assert len(pages) == -(-len(whole) // 1000)


def test_bad_queries_are_typed_errors_on_the_rpc(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    handle = stored(stubs, run_id, as_json_part(TICKETS))
    text = stored(stubs, run_id, "plain text, not JSON")
    two_parts = stored(stubs, run_id, "[1]", "[2]")
    image = stored(stubs, run_id, binary("image/png", b"\x89PNG"))
    cases = [
        ({"handle": handle, "query": "items[?"}, "PATTERN_INVALID"),
        ({"handle": handle, "query": "x" * 1025}, "PATTERN_INVALID"),
        ({"handle": handle, "query": "nope(items)"}, "PATTERN_INVALID"),
        ({"handle": handle, "query": "sum(items)"}, "PATTERN_INVALID"),
        ({"handle": handle, "query": "(" * 600 + "a" + ")" * 600}, "PATTERN_INVALID"),
        ({"handle": text, "query": "a"}, "FIELD_INVALID"),
        ({"handle": two_parts, "query": "a"}, "FIELD_INVALID"),
        ({"handle": image, "query": "a"}, "FIELD_INVALID"),
        ({"handle": handle, "query": "a", "grep": "a"}, "FIELD_INVALID"),
    ]
    for fields, reason in cases:
        failure = rpc_failure(partial(read, stubs, run_id, **fields))
        assert failure.code == grpc.StatusCode.INVALID_ARGUMENT, fields
        assert failure.info.reason == reason, (fields, failure.message)
        assert failure.info.metadata["field"] == "query"


def test_a_query_that_would_blow_up_is_stopped_by_its_bounds(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    # Each stage doubles what the value stands for while visiting a few nodes: 40 stages
    # stand for 2**40 copies, which to_string, equality and the result itself must not walk.
    run_id = run_with(stubs, unique("agent"))
    handle = stored(stubs, run_id, as_json_part({"a": "x" * 100}))
    doubling = "a" + " | [@, @]" * 40
    for query in (
        doubling,
        f"to_string({doubling})",
        f"[{doubling}, {doubling}] | [0] == [1]",
        f"contains([{doubling}], {doubling})",
        "a" + " | join('', [@, @])" * 40,
    ):
        failure = rpc_failure(partial(read, stubs, run_id, handle, query=query))
        assert failure.info.reason == "PATTERN_TOO_COMPLEX", (query, failure.message)
        assert failure.info.metadata["field"] == "query"


def test_a_handle_of_another_run_is_refused_for_a_query(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    owner = run_with(stubs, unique("agent"))
    handle = stored(stubs, owner, as_json_part(TICKETS))
    other = run_with(stubs, unique("agent"))
    failure = rpc_failure(lambda: read(stubs, other, handle, query="items[0]"))
    assert failure.info.reason == "INVALID_DEFERRED_HANDLE"


def test_the_model_queries_through_read_tool_output(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), thresholds=thresholds(per_result_tokens=1000))
    append(stubs, run_id, user("fetch"), assistant("", ("c1", "fetch", "{}")))
    (appended,) = append(stubs, run_id, result("c1", json.dumps(TICKETS)))
    append(stubs, run_id, user("which are open for Ana?"))
    # The elided view's guidance mentions the query when the content is JSON.
    shown = history_results(assemble(stubs, run_id))["c1"]
    assert shown.elided
    assert "query takes a JMESPath expression" in shown.content[0].text
    handle = appended.handle
    query = "items[?status=='open' && assignee=='Ana'].id"
    is_error, text = model_reads(stubs, run_id, "q1", {"handle": handle, "query": query})
    assert not is_error
    assert json.loads(text) == OPEN_FOR_ANA
    is_error, text = model_reads(
        stubs, run_id, "q2", {"handle": handle, "query": "items[].id", "limit": 100}
    )
    assert not is_error
    assert text.startswith('["T-0","T-1"')
    assert "continue with the same query and offset 100" in text
    for call_id, arguments, said in (
        ("e1", {"handle": handle, "query": "items[?"}, "not a valid JMESPath expression"),
        ("e2", {"handle": handle, "query": "a", "grep": "b"}, "cannot be combined"),
        ("e3", {"handle": handle, "query": "items" + " | [@, @]" * 40}, "larger than"),
        ("e4", {"handle": handle, "query": 5}, "'query' must be a string"),
    ):
        is_error, text = model_reads(stubs, run_id, call_id, arguments)
        assert is_error, text
        assert said in text


def test_a_plain_text_preview_says_nothing_of_queries(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), thresholds=thresholds(per_result_tokens=1000))
    append(stubs, run_id, user("fetch"), assistant("", ("c1", "fetch", "{}")))
    append(stubs, run_id, result("c1", "row\n" * 3000))
    append(stubs, run_id, user("next"))
    shown = history_results(assemble(stubs, run_id))["c1"]
    assert shown.elided
    assert "JMESPath" not in shown.content[0].text
    is_error, text = model_reads(
        stubs, run_id, "q1", {"handle": shown.handle, "query": "length(@)"}
    )
    assert is_error
    assert "not JSON" in text

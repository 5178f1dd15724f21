"""Turns and calls end to end: the real sidecar, real databases, the project's real MCP test
server over stdio (tests/mcp_servers/fixture_server.py), driven through the gRPC contract."""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable

import grpc
import pytest

from psych.sidecar.v1 import (
    connection_pb2,
    run_pb2,
    spec_pb2,
    tool_service_pb2,
    turn_pb2,
)
from tests.support.host import HOST_SIDECAR_OVERRIDES, Host, result_text
from tests.support.polling import wait_for
from tests.support.requests import all_records
from tests.support.sidecar import Stubs, rpc_failure

PNG_PREFIX = b"\x89PNG\r\n\x1a\n"


SIDECAR_OVERRIDES = HOST_SIDECAR_OVERRIDES


# One transport is enough here (the transports have their own tests); both databases run.
SIDECAR_TRANSPORTS = ["unix"]


def tool_result_record(stubs: Stubs, run_id: str, sequence: int) -> run_pb2.Record:
    (record,) = [r for r in all_records(stubs, run_id) if r.sequence == sequence]
    assert record.WhichOneof("kind") == "tool_result"
    return record


def wait_for_state(
    host: Host, run_id: str, server: str, state: int, within: float = 30
) -> turn_pb2.ServerLine:
    """Resolve turns until the server's line shows the state (a bounded wait, not a timing test)."""
    seen: dict[str, turn_pb2.ServerLine] = {}

    def reached() -> turn_pb2.ServerLine | None:
        host.new_turn(run_id)
        seen.clear()
        seen.update((line.server, line) for line in host.resolve(run_id).servers)
        line = seen.get(server)
        return line if line is not None and line.state == state else None

    return wait_for(
        reached, lambda: f"{server} to reach state {state}: {seen}", within=within, every=0.1
    )


def test_a_server_connected_between_two_turns_is_usable_on_the_second(
    host: Host, stubs: Stubs
) -> None:
    run_id = host.run(host.tenant)
    first = host.resolve(run_id)
    # Only the sidecar's own tool, before any server is connected.
    assert [tool.name for tool in first.tools] == ["read_tool_output"]
    assert list(first.servers) == []

    host.connect("fx", "--tools", "0", preload=True, description="The project's fixture server.")
    host.new_turn(run_id)
    second = host.resolve(run_id)
    (line,) = second.servers
    assert line.server == "fx"
    assert line.tier == turn_pb2.DISCLOSURE_TIER_DIRECT
    assert line.state == connection_pb2.CONNECTION_STATE_CONNECTED
    assert line.permitted_tool_count == 17
    assert "The project's fixture server." in line.text
    names = [tool.name for tool in second.tools]
    assert "fx__echo" in names
    assert names == sorted(names)

    response = host.dispatch(run_id, "fx__echo", {"text": "hello"})
    assert response.disposition == tool_service_pb2.DISPATCH_DISPOSITION_EXECUTED
    assert not response.outcome.is_error
    assert result_text(response.outcome) == "hello"
    record = tool_result_record(stubs, run_id, response.outcome.sequence)
    assert record.handle == response.outcome.handle
    assert record.tool_result.server == "fx"
    assert record.tool_result.tool == "echo"
    assert record.tool_result.call_id == "call-1"
    assert record.tool_result.content[0].text == "hello"


def test_resolving_twice_gives_the_same_bytes(host: Host) -> None:
    host.connect("one", "--tools", "3", preload=True)
    host.connect("two", "--tools", "40", preload=True)
    host.connect("three", "--tools", "300", preload=True)
    host.connect("four", "--tools", "20")
    run_id = host.run(host.tenant)
    first = host.resolve(run_id)
    assert first.SerializeToString(deterministic=True) == host.resolve(run_id).SerializeToString(
        deterministic=True
    )
    tiers = {line.server: line.tier for line in first.servers}
    assert tiers == {
        "four": turn_pb2.DISCLOSURE_TIER_DEFERRED,
        "one": turn_pb2.DISCLOSURE_TIER_DIRECT,
        "three": turn_pb2.DISCLOSURE_TIER_SEARCH,
        "two": turn_pb2.DISCLOSURE_TIER_FACADE,
    }
    for tool in first.tools:
        schema = tool.input_schema_json
        assert (
            schema
            == json.dumps(
                json.loads(schema), sort_keys=True, separators=(",", ":"), ensure_ascii=False
            ).encode()
        )


def test_a_grant_narrowed_between_two_calls_refuses_the_second(host: Host, stubs: Stubs) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant)
    stale_surface = host.resolve(run_id)
    assert "fx__echo" in [tool.name for tool in stale_surface.tools]
    assert not host.dispatch(run_id, "fx__echo", {"text": "first"}).outcome.is_error

    host.connect("fx", "--tools", "0", preload=True, deny_tools=["echo"])
    # The model still holds the old surface; the call is re-checked now, and refused.
    refused = host.dispatch(run_id, "fx__echo", {"text": "second"})
    assert refused.disposition == tool_service_pb2.DISPATCH_DISPOSITION_EXECUTED
    assert refused.outcome.is_error
    assert "no tool 'echo' on fx that you may use" in result_text(refused.outcome)
    assert host.call(run_id, "fx", "echo", text="third").is_error
    # The surface is pinned for the turn; the next turn's no longer offers the tool.
    assert "fx__echo" in [tool.name for tool in host.resolve(run_id).tools]
    host.new_turn(run_id)
    assert "fx__echo" not in [tool.name for tool in host.resolve(run_id).tools]
    record = tool_result_record(stubs, run_id, refused.outcome.sequence)
    assert record.tool_result.is_error


def test_a_removed_tool_is_refused_through_narrowing_not_handed_to_the_host(host: Host) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant)
    assert not host.dispatch(run_id, "fx__add_tool", {"name": "extra"}).outcome.is_error

    def offered() -> bool:
        host.new_turn(run_id)
        return "fx__extra" in [tool.name for tool in host.resolve(run_id).tools]

    wait_for(offered, "list_changed to reach the surface", every=0.1)
    assert result_text(host.dispatch(run_id, "fx__extra").outcome) == "extra ran"

    assert not host.dispatch(run_id, "fx__remove_tool", {"name": "extra"}).outcome.is_error
    wait_for(lambda: not offered(), "the removal to reach the surface", every=0.1)
    stale = host.dispatch(run_id, "fx__extra")
    assert stale.disposition == tool_service_pb2.DISPATCH_DISPOSITION_EXECUTED
    assert stale.outcome.is_error


def test_meta_tools_list_only_permitted_names_and_refuse_the_rest(host: Host) -> None:
    host.connect("fx", "--tools", "30", preload=False)
    grants = [
        spec_pb2.ToolGrant(server_pattern="fx", tool_pattern="bulk_00?"),
        spec_pb2.ToolGrant(server_pattern="f*", tool_pattern="echo"),
    ]
    run_id = host.run(host.tenant, grants)
    surface = host.resolve(run_id)
    assert sorted(tool.name for tool in surface.tools) == [
        "mcp_call_tool",
        "mcp_describe_tool",
        "mcp_list_tools",
        "read_tool_output",
    ]
    (line,) = surface.servers
    assert line.tier == turn_pb2.DISCLOSURE_TIER_DEFERRED
    assert line.permitted_tool_count == 11

    listed = host.dispatch(run_id, "mcp_list_tools", {"server": "fx"}).outcome
    assert not listed.is_error
    permitted = [f"bulk_00{i}" for i in range(10)] + ["echo"]
    assert json.loads(listed.result_json)["structuredContent"]["tools"] == permitted
    page = host.stubs.tools.ListServerTools(
        tool_service_pb2.ListServerToolsRequest(run_id=run_id, server="fx", page_size=7)
    )
    rest = host.stubs.tools.ListServerTools(
        tool_service_pb2.ListServerToolsRequest(
            run_id=run_id, server="fx", page_size=7, page_token=page.next_page_token
        )
    )
    assert [*page.tool_names, *rest.tool_names] == permitted
    assert rest.next_page_token == ""

    described = host.dispatch(run_id, "mcp_describe_tool", {"server": "fx", "tool": "echo"})
    body = json.loads(described.outcome.result_json)["structuredContent"]
    assert body["input_schema"]["properties"] == {"text": {"type": "string"}}
    tool = host.stubs.tools.DescribeTool(
        tool_service_pb2.DescribeToolRequest(run_id=run_id, server="fx", tool="echo")
    ).tool
    assert (tool.server, tool.name) == ("fx", "echo")

    # Discovery is a door, not a bypass: pid exists on the server but is not granted.
    for name, arguments in [
        ("mcp_call_tool", {"server": "fx", "tool": "pid"}),
        ("mcp_describe_tool", {"server": "fx", "tool": "pid"}),
        ("fx__pid", {}),
    ]:
        refused = host.dispatch(run_id, name, arguments).outcome
        assert refused.is_error, name
        assert "no tool 'pid' on fx that you may use" in result_text(refused)
    failure = rpc_failure(
        lambda: host.stubs.tools.DescribeTool(
            tool_service_pb2.DescribeToolRequest(run_id=run_id, server="fx", tool="pid")
        )
    )
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT
    failure = rpc_failure(
        lambda: host.stubs.tools.ListServerTools(
            tool_service_pb2.ListServerToolsRequest(run_id=run_id, server="elsewhere")
        )
    )
    assert failure.code == grpc.StatusCode.NOT_FOUND
    assert failure.info.reason == "CONNECTION_NOT_FOUND"
    called = host.dispatch(
        run_id, "mcp_call_tool", {"server": "fx", "tool": "echo", "input": {"text": "via meta"}}
    )
    assert result_text(called.outcome) == "via meta"
    # Recorded under the server and the tool it ran, not the facade's name (docs/prompt.md).
    record = tool_result_record(host.stubs, run_id, called.outcome.sequence)
    assert (record.tool_result.server, record.tool_result.tool) == ("fx", "echo")


def test_what_a_model_gets_wrong_is_a_tool_error_in_the_log(host: Host, stubs: Stubs) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant)
    cases = {
        "unknown server": host.call(run_id, "nowhere", "echo", text="x"),
        "unknown tool": host.call(run_id, "fx", "no_such_tool"),
        "wrong type": host.call(run_id, "fx", "echo", text=5),
        "missing argument": host.dispatch(run_id, "fx__echo", {}).outcome,
        "not JSON": host.dispatch(run_id, "fx__echo", raw="{text: ").outcome,
        "not an object": host.dispatch(run_id, "fx__echo", raw="[1]").outcome,
        "meta without server": host.dispatch(run_id, "mcp_call_tool", {"tool": "echo"}).outcome,
    }
    for what, outcome in cases.items():
        assert outcome.is_error, what
        assert outcome.handle, what
        record = tool_result_record(stubs, run_id, outcome.sequence)
        assert record.tool_result.is_error, what
        assert record.tool_result.content[0].text == result_text(outcome), what
    assert result_text(cases["unknown server"]) == "There is no MCP server 'nowhere'. Servers: fx."
    assert "text: 5 is not of type 'string'" in result_text(cases["wrong type"])
    assert result_text(host.call(run_id, "fx", "huge_text", size=3)) == "xxx"
    assert "'text' is a required property" in result_text(cases["missing argument"])
    assert "not valid JSON" in result_text(cases["not JSON"])
    meta = tool_result_record(stubs, run_id, cases["meta without server"].sequence)
    assert meta.tool_result.tool == "mcp_call_tool"


def test_every_result_kind_is_logged_in_full_with_its_handle(host: Host, stubs: Stubs) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant)
    size = 3 * 1024 * 1024
    outcomes = {
        name: host.call(run_id, "fx", name, **arguments)
        for name, arguments in [
            ("huge_text", {"size": size}),
            ("image", {}),
            ("audio", {}),
            ("blob", {}),
            ("structured", {}),
            ("resource_text", {}),
            ("tool_error", {}),
            ("fail", {}),
        ]
    }
    records = {r.sequence: r for r in all_records(stubs, run_id)}
    parts = {
        name: list(records[outcome.sequence].tool_result.content)
        for name, outcome in outcomes.items()
    }
    for name, outcome in outcomes.items():
        record = records[outcome.sequence]
        assert record.handle == outcome.handle != ""
        assert record.tool_result.is_error == outcome.is_error, name
        assert record.tool_result.tool == name
    assert parts["huge_text"][0].text == "x" * size
    assert parts["image"][0].binary.mime_type == "image/png"
    assert parts["image"][0].binary.data.startswith(PNG_PREFIX)
    assert parts["audio"][0].binary.mime_type == "audio/wav"
    assert parts["blob"][0].binary.data == bytes(range(256))
    assert any(json.loads(p.json or b"null") == {"answer": 42} for p in parts["structured"])
    assert not outcomes["structured"].is_error
    assert outcomes["tool_error"].is_error
    assert parts["tool_error"][0].text == "bad input: value must be positive"
    assert outcomes["fail"].is_error


def test_a_hanging_tool_times_out_as_a_tool_error(host: Host) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant)
    outcome = host.call(run_id, "fx", "hang", timeout=0.5)
    assert outcome.is_error
    assert "did not answer" in result_text(outcome)
    assert not host.call(run_id, "fx", "echo", text="still there").is_error


def test_a_killed_server_is_unreachable_next_turn_and_a_restart_brings_it_back(
    host: Host,
) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    run_id = host.run(host.tenant)
    pid = int(result_text(host.call(run_id, "fx", "pid")))
    os.kill(pid, signal.SIGKILL)

    down = wait_for_state(host, run_id, "fx", connection_pb2.CONNECTION_STATE_UNREACHABLE, 30)
    assert "UNREACHABLE" not in down.text  # the state is said in the transient message
    assert down.permitted_tool_count == 17  # its last known tools stay
    surface = host.resolve(run_id)
    assert "fx__echo" in [tool.name for tool in surface.tools]
    failed = host.dispatch(run_id, "fx__echo", {"text": "anyone?"})
    assert failed.disposition == tool_service_pb2.DISPATCH_DISPOSITION_EXECUTED
    assert failed.outcome.is_error
    assert failed.outcome.handle

    wait_for_state(host, run_id, "fx", connection_pb2.CONNECTION_STATE_CONNECTED, 60)
    back = host.call(run_id, "fx", "echo", text="back")
    assert not back.is_error
    assert result_text(back) == "back"
    assert int(result_text(host.call(run_id, "fx", "pid"))) != pid


def test_facade_and_search_tiers_reach_exactly_the_permitted_tools(host: Host) -> None:
    host.connect("mid", "--tools", "30", preload=True)
    host.connect("big", "--tools", "250", preload=True)
    grants = [
        spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*"),
    ]
    run_id = host.run(host.tenant, grants)
    surface = host.resolve(run_id)
    facade = {tool.name: tool for tool in surface.tools}["mid"]
    assert facade.kind == turn_pb2.EXPOSED_TOOL_KIND_FACADE
    # A first line, one per tool, and the line saying arguments may reference results.
    assert len(facade.description.splitlines()) == 1 + 47 + 1
    via_facade = host.dispatch(run_id, "mid", {"tool": "echo", "input": {"text": "facade"}})
    assert result_text(via_facade.outcome) == "facade"
    assert host.dispatch(run_id, "mid", {"tool": "nope"}).outcome.is_error

    found = host.dispatch(run_id, "mcp_search_tools", {"query": "bulk_123"}).outcome
    results = json.loads(found.result_json)["structuredContent"]["results"]
    assert results[0]["server"] == "big"
    assert results[0]["tool"] == "bulk_123"
    called = host.dispatch(
        run_id, "mcp_call_tool_by_name", {"name": results[0]["name"], "input": {"value": "v"}}
    )
    assert result_text(called.outcome) == "bulk_123 ran"

    hits = host.stubs.tools.SearchTools(
        tool_service_pb2.SearchToolsRequest(run_id=run_id, query="echo", page_size=5)
    )
    # The exact name first on both servers; semantic neighbours may follow.
    ranked = [(hit.server, hit.tool) for hit in hits.hits]
    assert ranked[:2] == [("big", "echo"), ("mid", "echo")]
    request = tool_service_pb2.SearchToolsRequest(run_id=run_id, query="generated", page_size=100)
    seen: list[tuple[str, str]] = []
    while True:
        page = host.stubs.tools.SearchTools(request)
        seen.extend((hit.server, hit.tool) for hit in page.hits)
        if not page.next_page_token:
            break
        request.page_token = page.next_page_token
    # Pages neither repeat nor skip: every generated tool (the word is in each description)
    # is there once.
    generated = {
        (server, f"bulk_{i:03d}")
        for server, count in (("mid", 30), ("big", 250))
        for i in range(count)
    }
    assert len(seen) == len(set(seen))
    assert generated <= set(seen)


def test_a_tool_listed_at_runtime_is_encoded_for_search_before_any_search(
    host: Host, unique: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    # What the first search of a Run would otherwise pay: the tool's texts go through the
    # encoder in the background as soon as the listing with the tool is stored.
    host.connect("warm", "--tools", "0", preload=False)
    run_id = host.run(host.tenant)
    name = unique("sundial")
    with caplog.at_level(logging.INFO, logger="psych_sidecar.search.embeddings"):
        added = host.call(
            run_id, "warm", "add_tool", name=name, description="Tells the hour from a shadow."
        )
        assert not added.is_error

        def warmed() -> bool:
            return any(
                r.message.startswith("search warm-up: 2 texts") and ", 2 encoded in" in r.message
                for r in caplog.records
            )

        wait_for(warmed, "the new tool to be encoded", within=60, every=0.1)
    hits = host.stubs.tools.SearchTools(
        tool_service_pb2.SearchToolsRequest(run_id=run_id, query="what hour is it", page_size=3)
    )
    assert (hits.hits[0].server, hits.hits[0].tool) == ("warm", name)
    assert not hits.partial


def test_a_run_sees_only_its_own_tenants_connections(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    owner, other = Host(stubs, unique("owner")), Host(stubs, unique("other"))
    owner.connect("private", "--tools", "0")
    run_id = other.run(other.tenant)
    assert list(other.resolve(run_id).servers) == []
    outcome = other.call(run_id, "private", "echo", text="x")
    assert outcome.is_error
    assert "no MCP server 'private'" in result_text(outcome)


def test_names_that_are_not_the_sidecars_go_to_the_host(host: Host, stubs: Stubs) -> None:
    host.connect("fx", "--tools", "0", preload=True)
    # The tenant has fx, but this Run's Spec grants nothing on it: fx is not the Run's.
    run_id = host.run(host.tenant, [spec_pb2.ToolGrant(server_pattern="other", tool_pattern="*")])
    before = len(all_records(stubs, run_id))
    for name in ("bash", "fx__echo", "fx"):
        response = host.dispatch(run_id, name, {"command": "ls"})
        assert response.disposition == tool_service_pb2.DISPATCH_DISPOSITION_HOST_TOOL, name
        assert not response.HasField("outcome")
    assert len(all_records(stubs, run_id)) == before
    assert list(host.resolve(run_id).servers) == []


def test_host_mistakes_are_rpc_errors(host: Host) -> None:
    failure = rpc_failure(lambda: host.resolve("run_nope"))
    assert failure.code == grpc.StatusCode.NOT_FOUND
    assert failure.info.reason == "RUN_NOT_FOUND"
    run_id = host.run(host.tenant)
    failure = rpc_failure(
        lambda: host.stubs.tools.CallDeferredTool(
            tool_service_pb2.CallDeferredToolRequest(run_id=run_id, server="s", tool="t")
        )
    )
    assert failure.info.reason == "FIELD_REQUIRED"
    assert failure.info.metadata["field"] == "call_id"

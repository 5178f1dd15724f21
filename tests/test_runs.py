"""CreateRun / GetRun / AppendRecords / ListRecords over the real server, on both databases."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import grpc

from psych.sidecar.v1 import content_pb2, run_pb2, run_service_pb2, spec_pb2
from tests.support.databases import WITH_PGBOUNCER
from tests.support.requests import all_records, new_run, publish, text_part, tool_result, user
from tests.support.sidecar import Stubs, rpc_failure

# Appends, reads and large values (the temporary table of bulk_values) through PgBouncer in
# transaction mode too.
SIDECAR_DATABASES = WITH_PGBOUNCER

MIB = 1024 * 1024


def _append(stubs: Stubs, run_id: str, *records: run_pb2.Record, request_id: str = "") -> list[int]:
    response = stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(
            run_id=run_id, request_id=request_id, records=list(records)
        )
    )
    return [entry.sequence for entry in response.records]


def _count(stubs: Stubs, run_id: str) -> int:
    return len(all_records(stubs, run_id))


def test_create_and_get_run(stubs: Stubs, unique: Callable[[str], str]) -> None:
    spec_name = unique("agent")
    publish(stubs, spec_name)
    restriction = spec_pb2.ToolGrant(server_pattern="git", tool_pattern="log")
    created = stubs.runs.CreateRun(
        run_service_pb2.CreateRunRequest(
            tenant="acme", spec_name=spec_name, spec_version=1, tool_restrictions=[restriction]
        )
    ).run
    assert created.run_id.startswith("run_")
    fetched = stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=created.run_id)).run
    assert fetched == created
    assert (fetched.tenant, fetched.spec_name, fetched.spec_version) == ("acme", spec_name, 1)
    assert list(fetched.tool_restrictions) == [restriction]


def test_create_run_refuses_bad_input(stubs: Stubs, unique: Callable[[str], str]) -> None:
    spec_name = unique("agent")
    publish(stubs, spec_name)
    cases: list[tuple[dict[str, Any], str, str]] = [
        (dict(spec_name=spec_name, spec_version=1), "FIELD_REQUIRED", "tenant"),
        (dict(tenant="a b", spec_name=spec_name, spec_version=1), "FIELD_INVALID", "tenant"),
        (dict(tenant="acme", spec_version=1), "FIELD_REQUIRED", "spec_name"),
        (dict(tenant="acme", spec_name=spec_name), "FIELD_REQUIRED", "spec_version"),
    ]
    for fields, reason, field in cases:
        failure = rpc_failure(
            partial(stubs.runs.CreateRun, run_service_pb2.CreateRunRequest(**fields))
        )
        assert (failure.code, failure.info.reason, failure.info.metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            reason,
            field,
        )
    unknown = rpc_failure(
        lambda: stubs.runs.CreateRun(
            run_service_pb2.CreateRunRequest(tenant="acme", spec_name=spec_name, spec_version=2)
        )
    )
    assert (unknown.code, unknown.info.reason) == (grpc.StatusCode.NOT_FOUND, "SPEC_NOT_FOUND")


def test_unknown_run_is_not_found_everywhere(stubs: Stubs) -> None:
    calls = [
        lambda: stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id="run_missing")),
        lambda: _append(stubs, "run_missing", user("hi")),
        lambda: stubs.runs.ListRecords(run_service_pb2.ListRecordsRequest(run_id="run_missing")),
    ]
    for call in calls:
        failure = rpc_failure(call)
        assert (failure.code, failure.info.reason) == (grpc.StatusCode.NOT_FOUND, "RUN_NOT_FOUND")
        assert failure.info.metadata["run_id"] == "run_missing"


def test_records_round_trip_byte_identical(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = new_run(stubs, unique("agent"))
    binary = bytes(range(256)) * 64 + b"\x00\xff"
    assistant = run_pb2.Record(
        assistant_message=run_pb2.AssistantMessage(
            content=[text_part("Let me look.")],
            tool_calls=[
                content_pb2.ToolCall(
                    call_id="c1", name="git__log", arguments_json='{"n": 5,  "x":1.0}'
                ),
                content_pb2.ToolCall(call_id="c2", name="broken", arguments_json="{not json"),
            ],
        )
    )
    result = run_pb2.Record(
        tool_result=run_pb2.ToolResult(
            call_id="c1",
            server="git",
            tool="log",
            content=[
                text_part("línea 1\x00 with NUL\r\n🙂"),
                content_pb2.ContentPart(json=b'{"b": 1, "a": [1.50, 2e3]}'),
                content_pb2.ContentPart(
                    binary=content_pb2.BinaryContent(mime_type="image/png", data=binary)
                ),
            ],
        )
    )
    failed = tool_result("c2", text_part("Traceback: boom"), is_error=True)
    sent = [user("Show me the log"), assistant, result, failed]
    response = stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=sent)
    )
    assert [entry.sequence for entry in response.records] == [1, 2, 3, 4]
    handles = [entry.handle for entry in response.records]
    assert handles[0] == handles[1] == ""
    assert handles[2].startswith("h_")
    assert handles[3].startswith("h_")
    assert handles[2] != handles[3]

    stored = all_records(stubs, run_id)
    assert [r.sequence for r in stored] == [1, 2, 3, 4]
    assert all(r.run_id == run_id and r.create_time.seconds > 0 for r in stored)
    assert [r.handle for r in stored] == handles
    for got, want in zip(stored, sent, strict=True):
        kind = want.WhichOneof("kind")
        assert kind is not None
        assert got.WhichOneof("kind") == kind
        assert getattr(got, kind).SerializeToString(deterministic=True) == getattr(
            want, kind
        ).SerializeToString(deterministic=True)
    assert stored[2].tool_result.content[2].binary.data == binary
    assert stored[2].tool_result.content[1].json == b'{"b": 1, "a": [1.50, 2e3]}'
    assert _count(stubs, run_id) == 4


def test_retried_append_with_the_same_request_id_stores_once(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = new_run(stubs, unique("agent"))
    _append(stubs, run_id, user("first"))
    request = run_service_pb2.AppendRecordsRequest(
        run_id=run_id, request_id="req-1", records=[user("q"), tool_result("c1", text_part("r"))]
    )
    first = stubs.runs.AppendRecords(request)
    retried = stubs.runs.AppendRecords(request)
    assert retried == first
    assert [e.sequence for e in first.records] == [2, 3]
    assert _count(stubs, run_id) == 3
    assert len(all_records(stubs, run_id)) == 3


def test_a_reused_request_id_with_other_records_is_refused(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = new_run(stubs, unique("agent"))
    _append(stubs, run_id, user("one"), request_id="req-1")
    failure = rpc_failure(lambda: _append(stubs, run_id, user("two"), request_id="req-1"))
    assert (failure.code, failure.info.reason) == (
        grpc.StatusCode.ALREADY_EXISTS,
        "REQUEST_ID_REUSED",
    )
    assert failure.info.metadata["request_id"] == "req-1"
    assert [r.user_message.content[0].text for r in all_records(stubs, run_id)] == ["one"]


def test_request_ids_are_scoped_to_their_run(stubs: Stubs, unique: Callable[[str], str]) -> None:
    spec_name = unique("agent")
    first_run = new_run(stubs, spec_name)
    second_run = new_run(stubs, spec_name)
    assert _append(stubs, first_run, user("a"), request_id="same") == [1]
    assert _append(stubs, second_run, user("b"), request_id="same") == [1]


def test_bad_records_are_refused_and_nothing_is_stored(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = new_run(stubs, unique("agent"))
    _append(stubs, run_id, user("kept"))
    cases = [
        ([], "FIELD_REQUIRED", "records"),
        ([user("ok"), run_pb2.Record()], "FIELD_REQUIRED", "records[1].kind"),
        (
            [run_pb2.Record(user_message=run_pb2.UserMessage())],
            "FIELD_REQUIRED",
            "records[0].user_message.content",
        ),
        (
            [run_pb2.Record(user_message=run_pb2.UserMessage(content=[content_pb2.ContentPart()]))],
            "FIELD_REQUIRED",
            "records[0].user_message.content[0].kind",
        ),
        ([tool_result("")], "FIELD_REQUIRED", "records[0].tool_result.call_id"),
        (
            [
                tool_result(
                    "c", content_pb2.ContentPart(binary=content_pb2.BinaryContent(data=b"x"))
                )
            ],
            "FIELD_REQUIRED",
            "records[0].tool_result.content[0].binary.mime_type",
        ),
        ([tool_result("c\x00")], "FIELD_INVALID", "records[0].tool_result.call_id"),
        (
            [run_pb2.Record(tool_result=run_pb2.ToolResult(call_id="c", server="git\x00"))],
            "FIELD_INVALID",
            "records[0].tool_result.server",
        ),
        (
            [tool_result("c", content_pb2.ContentPart(json=b"{nope"))],
            "FIELD_INVALID",
            "records[0].tool_result.content[0].json",
        ),
        (
            [
                run_pb2.Record(
                    assistant_message=run_pb2.AssistantMessage(
                        tool_calls=[content_pb2.ToolCall(call_id="c", arguments_json="{}")]
                    )
                )
            ],
            "FIELD_REQUIRED",
            "records[0].assistant_message.tool_calls[0].name",
        ),
    ]
    for records, reason, field in cases:
        failure = rpc_failure(partial(_append, stubs, run_id, *records))
        assert (failure.code, failure.info.reason, failure.info.metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            reason,
            field,
        )
    too_long = rpc_failure(lambda: _append(stubs, run_id, user("x"), request_id="r" * 129))
    assert too_long.info.metadata["field"] == "request_id"
    assert _count(stubs, run_id) == 1
    assert len(all_records(stubs, run_id)) == 1


def test_a_ten_mib_record_round_trips(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = new_run(stubs, unique("agent"))
    big_text = ("0123456789abcdef" * (10 * MIB // 16))[: 10 * MIB]
    big_binary = os.urandom(10 * MIB)
    _append(stubs, run_id, tool_result("c1", text_part(big_text)))
    _append(
        stubs,
        run_id,
        tool_result(
            "c2",
            content_pb2.ContentPart(
                binary=content_pb2.BinaryContent(
                    mime_type="application/octet-stream", data=big_binary
                )
            ),
        ),
    )
    stored = all_records(stubs, run_id)
    assert stored[0].tool_result.content[0].text == big_text
    assert stored[1].tool_result.content[0].binary.data == big_binary


def test_list_records_pages_with_opaque_tokens(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = new_run(stubs, unique("agent"))
    for batch in range(5):
        _append(stubs, run_id, *[user(f"m{batch * 5 + i}") for i in range(5)])
    first = stubs.runs.ListRecords(run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=10))
    assert [r.sequence for r in first.records] == list(range(1, 11))
    assert first.next_page_token
    paged = all_records(stubs, run_id, page_size=10)
    assert [r.user_message.content[0].text for r in paged] == [f"m{i}" for i in range(25)]
    exact = all_records(stubs, run_id, page_size=25)
    assert len(exact) == 25
    last = stubs.runs.ListRecords(run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=25))
    assert last.next_page_token == ""


def test_list_records_filters_by_kind(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = new_run(stubs, unique("agent"))
    _append(
        stubs,
        run_id,
        user("q1"),
        tool_result("c1", text_part("r1")),
        user("q2"),
        tool_result("c2", text_part("r2")),
    )
    request = run_service_pb2.ListRecordsRequest(
        run_id=run_id, kinds=[run_pb2.RECORD_KIND_TOOL_RESULT], page_size=1
    )
    first = stubs.runs.ListRecords(request)
    assert [r.sequence for r in first.records] == [2]
    request.page_token = first.next_page_token
    second = stubs.runs.ListRecords(request)
    assert [r.sequence for r in second.records] == [4]


def test_list_records_refuses_bad_paging_and_enum_zero(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    spec_name = unique("agent")
    run_id = new_run(stubs, spec_name)
    other_run = new_run(stubs, spec_name)
    _append(stubs, run_id, user("a"), user("b"))
    _append(stubs, other_run, user("a"), user("b"))
    token = stubs.runs.ListRecords(
        run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=1)
    ).next_page_token
    cases = [
        (run_service_pb2.ListRecordsRequest(run_id=run_id, page_token="garbage!"), "page_token"),
        (run_service_pb2.ListRecordsRequest(run_id=other_run, page_token=token), "page_token"),
        (
            run_service_pb2.ListRecordsRequest(
                run_id=run_id, page_token=token, kinds=[run_pb2.RECORD_KIND_USER_MESSAGE]
            ),
            "page_token",
        ),
        (run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=-1), "page_size"),
        (
            run_service_pb2.ListRecordsRequest(
                run_id=run_id, kinds=[run_pb2.RECORD_KIND_UNSPECIFIED]
            ),
            "kinds[0]",
        ),
    ]
    for request, field in cases:
        failure = rpc_failure(partial(stubs.runs.ListRecords, request))
        assert (failure.code, failure.info.reason, failure.info.metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "FIELD_INVALID",
            field,
        )


def test_concurrent_appends_get_gap_free_sequences(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = new_run(stubs, unique("agent"))
    assigned: list[int] = []
    lock = threading.Lock()

    def writer(worker: int) -> None:
        for index in range(10):
            got = _append(
                stubs,
                run_id,
                user(f"{worker}-{index}"),
                user("pair"),
                request_id=f"{worker}-{index}",
            )
            with lock:
                assigned.extend(got)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(assigned) == list(range(1, 121))
    stored = all_records(stubs, run_id)
    assert [r.sequence for r in stored] == list(range(1, 121))
    # Each append's two records are adjacent: appends are atomic.
    for first, second in zip(stored[::2], stored[1::2], strict=True):
        assert second.user_message.content[0].text == "pair"
        assert json.dumps(first.user_message.content[0].text) != '"pair"'

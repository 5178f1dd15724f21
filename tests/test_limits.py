"""The sidecar's own limits and its answer to the unexpected, over the real server."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from sqlalchemy import create_engine, text

from psych.sidecar.v1 import content_pb2, run_service_pb2
from tests.support.requests import all_records, new_run, text_part, tool_result, user
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

MIB = 1024 * 1024


# The smallest configurable message limit keeps the oversized requests small.
SIDECAR_OVERRIDES: dict[str, Any] = {"max_message_bytes": MIB}


def test_a_request_over_the_configured_maximum_is_refused_with_error_info(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = new_run(stubs, unique("agent"))
    stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user("x" * (MIB - 1024))])
    )
    failure = rpc_failure(
        lambda: stubs.runs.AppendRecords(
            run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user("x" * (MIB + 10))])
        )
    )
    assert failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert failure.info.reason == "MESSAGE_TOO_LARGE"
    assert failure.info.metadata["limit_bytes"] == str(MIB)
    assert int(failure.info.metadata["size_bytes"]) > MIB
    assert len(all_records(stubs, run_id)) == 1


def test_pages_stay_under_the_message_limit(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = new_run(stubs, unique("agent"))
    chunk = "y" * (MIB // 2)
    for index in range(5):
        stubs.runs.AppendRecords(
            run_service_pb2.AppendRecordsRequest(
                run_id=run_id, records=[tool_result(f"c{index}", text_part(chunk))]
            )
        )
    first = stubs.runs.ListRecords(run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=100))
    assert 1 <= len(first.records) < 5
    assert first.ByteSize() <= MIB
    records = all_records(stubs, run_id, page_size=100)
    assert [r.sequence for r in records] == [1, 2, 3, 4, 5]


def test_malformed_bytes_are_an_invalid_argument(grpc_channel: grpc.Channel) -> None:
    raw = grpc_channel.unary_unary(
        "/psych.sidecar.v1.RunService/GetRun",
        request_serializer=lambda payload: payload,
        response_deserializer=lambda payload: payload,
    )
    failure = rpc_failure(lambda: raw(b"\xff\xff\xff"))
    assert (failure.code, failure.info.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "FIELD_INVALID",
    )
    assert failure.info.metadata["field"] == "request"


def test_an_unexpected_failure_is_internal_with_a_correlation_id_and_no_stack_trace(
    stubs: Stubs,
    grpc_server: RunningSidecar,
    unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_id = new_run(stubs, unique("agent"))
    engine = create_engine(grpc_server.settings.resolved_database_url())
    with engine.begin() as connection:
        connection.execute(text("ALTER TABLE record_parts RENAME TO record_parts_away"))
    try:
        with caplog.at_level(logging.ERROR):
            failure = rpc_failure(
                lambda: stubs.runs.AppendRecords(
                    run_service_pb2.AppendRecordsRequest(
                        run_id=run_id,
                        records=[tool_result("c", content_pb2.ContentPart(text="lost"))],
                    )
                )
            )
    finally:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE record_parts_away RENAME TO record_parts"))
        engine.dispose()
    assert failure.code == grpc.StatusCode.INTERNAL
    assert failure.info.reason == "INTERNAL"
    correlation_id = failure.info.metadata["correlation_id"]
    assert correlation_id in failure.message
    assert "Traceback" not in failure.message
    assert "record_parts" not in failure.message
    logged = [r for r in caplog.records if correlation_id in r.getMessage()]
    assert logged
    assert logged[0].exc_info is not None
    # The failed append stored nothing, and the Run still works.
    assert all_records(stubs, run_id) == []
    stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user("ok")])
    )
    assert [r.sequence for r in all_records(stubs, run_id)] == [1]

"""UsageService over the real server on both databases: provider-reported numbers only."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import grpc
import pytest

from psych.sidecar.v1 import usage_service_pb2, usage_service_pb2_grpc
from tests.support.requests import new_run
from tests.support.sidecar import Stubs, rpc_failure


@pytest.fixture(scope="module")
def usage(grpc_channel: grpc.Channel) -> usage_service_pb2_grpc.UsageServiceStub:
    """The UsageService stub on the module's channel."""
    return usage_service_pb2_grpc.UsageServiceStub(grpc_channel)


def record(
    usage: usage_service_pb2_grpc.UsageServiceStub, run_id: str, **fields: Any
) -> usage_service_pb2.UsageTotals:
    fields.setdefault("model", "claude-test")
    request = usage_service_pb2.RecordUsageRequest(run_id=run_id, **fields)
    return usage.RecordUsage(request).totals


def totals(usage: usage_service_pb2_grpc.UsageServiceStub, run_id: str) -> tuple[Any, ...]:
    got = usage.GetRunUsage(usage_service_pb2.GetRunUsageRequest(run_id=run_id)).totals
    return (
        got.model_calls,
        got.input_tokens,
        got.output_tokens,
        got.cache_read_tokens,
        got.cache_write_tokens,
        got.cache_hit_ratio,
    )


def test_totals_sum_what_the_provider_reported(
    stubs: Stubs, usage: usage_service_pb2_grpc.UsageServiceStub, unique: Callable[[str], str]
) -> None:
    run_id = new_run(stubs, unique("agent"))
    assert totals(usage, run_id) == (0, 0, 0, 0, 0, 0.0)
    first = record(usage, run_id, input_tokens=1000, output_tokens=50, cache_write_tokens=3000)
    assert (first.model_calls, first.cache_hit_ratio) == (1, 0.0)
    second = record(
        usage, run_id, model="gpt-test", input_tokens=200, output_tokens=70, cache_read_tokens=3000
    )
    assert second.model_calls == 2
    assert totals(usage, run_id) == (2, 1200, 120, 3000, 3000, 3000 / 7200)
    other = new_run(stubs, unique("agent"))
    assert totals(usage, other)[0] == 0


def test_a_retried_record_counts_once(
    stubs: Stubs, usage: usage_service_pb2_grpc.UsageServiceStub, unique: Callable[[str], str]
) -> None:
    run_id = new_run(stubs, unique("agent"))
    for _ in range(3):
        record(usage, run_id, request_id="call-1", input_tokens=10, output_tokens=1)
    assert totals(usage, run_id)[:3] == (1, 10, 1)
    failure = rpc_failure(
        lambda: record(usage, run_id, request_id="call-1", input_tokens=11, output_tokens=1)
    )
    assert (failure.code, failure.info.reason) == (
        grpc.StatusCode.ALREADY_EXISTS,
        "REQUEST_ID_REUSED",
    )
    assert dict(failure.info.metadata) == {"run_id": run_id, "request_id": "call-1"}
    record(usage, run_id, input_tokens=10)
    record(usage, run_id, input_tokens=10)
    assert totals(usage, run_id)[:2] == (3, 30)


def test_bad_usage_is_refused_and_stores_nothing(
    stubs: Stubs, usage: usage_service_pb2_grpc.UsageServiceStub, unique: Callable[[str], str]
) -> None:
    run_id = new_run(stubs, unique("agent"))
    cases: list[tuple[dict[str, Any], str, str | None]] = [
        (dict(run_id="run_missing"), "RUN_NOT_FOUND", None),
        (dict(run_id=""), "FIELD_REQUIRED", "run_id"),
        (dict(run_id=run_id, model=""), "FIELD_REQUIRED", "model"),
        (dict(run_id=run_id, input_tokens=-1), "FIELD_INVALID", "input_tokens"),
        (dict(run_id=run_id, cache_read_tokens=-1), "FIELD_INVALID", "cache_read_tokens"),
        (dict(run_id=run_id, request_id="x" * 129), "FIELD_INVALID", "request_id"),
    ]
    for fields, reason, field in cases:
        fields.setdefault("model", "m")
        failure = rpc_failure(
            partial(usage.RecordUsage, usage_service_pb2.RecordUsageRequest(**fields))
        )
        assert failure.info.reason == reason
        if field:
            assert failure.info.metadata["field"] == field
    assert totals(usage, run_id)[0] == 0
    missing = rpc_failure(
        lambda: usage.GetRunUsage(usage_service_pb2.GetRunUsageRequest(run_id="run_missing"))
    )
    assert missing.info.reason == "RUN_NOT_FOUND"

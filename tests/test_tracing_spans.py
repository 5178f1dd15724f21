"""The span helpers of `telemetry.tracing` keep the SDK's semantics with their cheaper plumbing:
an internal span is current inside its block and nests under the RPC span, an escaping
exception marks it an error with the exception recorded (a cancellation does not), and with
tracing off nothing is made. Real SDK provider, in-memory exporter."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import cast

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import SpanKind, StatusCode

from psych_sidecar.telemetry import tracing

METHOD = "/psych.sidecar.v1.RunService/GetRun"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@contextlib.contextmanager
def installed(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    """`provider` installed as the sidecar's, exporting to memory, for the block."""
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()
        provider.shutdown()


def description(sampler: Sampler) -> str:
    """A sampler's description, through Sampler's typed signature (ParentBased's override of
    get_description carries no annotations)."""
    return sampler.get_description()


def ratio_sampler(ratio: float) -> Sampler:
    """The sidecar's sampler at `ratio`: parent-based, the roots decided by trace-id ratio."""
    made = cast(Sampler, tracing.sampler(ratio))
    # Its description says what it is (the SDK's samplers define no equality).
    assert description(made) == description(ParentBased(TraceIdRatioBased(ratio)))
    return made


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    with installed(TracerProvider()) as exporter:
        yield exporter


def test_internal_spans_nest_under_the_rpc_span_which_continues_the_traceparent(
    exported: InMemorySpanExporter,
) -> None:
    opened = tracing.start_rpc(METHOD, lambda: (("traceparent", TRACEPARENT),))
    with tracing.span("db.transaction", {"psych.write": False}) as inner:
        assert inner is not None
        assert trace.get_current_span() is inner
    tracing.end_rpc(opened, "OK", 0)
    assert not trace.get_current_span().get_span_context().is_valid

    inner_span, server = exported.get_finished_spans()
    assert server.name == "psych.sidecar.v1.RunService/GetRun"
    assert server.kind == SpanKind.SERVER
    assert dict(server.attributes or {}) == {
        "rpc.system": "grpc",
        "rpc.service": "psych.sidecar.v1.RunService",
        "rpc.method": "GetRun",
        "rpc.grpc.status_code": 0,
    }
    assert format(server.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert inner_span.parent is not None
    assert inner_span.parent.span_id == server.context.span_id
    assert dict(inner_span.attributes or {}) == {"psych.write": False}
    assert inner_span.status.status_code == StatusCode.UNSET


def test_an_escaping_exception_marks_the_span_an_error_and_is_recorded(
    exported: InMemorySpanExporter,
) -> None:
    with pytest.raises(ValueError, match="no such zone"), tracing.span("prompt.assemble"):
        raise ValueError("no such zone")
    (failed,) = exported.get_finished_spans()
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.status.description == "ValueError: no such zone"
    assert [event.name for event in failed.events] == ["exception"]
    assert not trace.get_current_span().get_span_context().is_valid


def test_a_cancellation_is_not_an_error(exported: InMemorySpanExporter) -> None:
    with pytest.raises(asyncio.CancelledError), tracing.span("mcp.call_tool"):
        raise asyncio.CancelledError
    (cancelled,) = exported.get_finished_spans()
    assert cancelled.status.status_code == StatusCode.UNSET
    assert not cancelled.events


def test_an_rpc_answered_with_an_error_code_is_an_error_span(
    exported: InMemorySpanExporter,
) -> None:
    tracing.end_rpc(tracing.start_rpc(METHOD, lambda: None), "NOT_FOUND", 5)
    (server,) = exported.get_finished_spans()
    assert server.parent is None
    assert server.status.status_code == StatusCode.ERROR
    assert server.status.description == "NOT_FOUND"
    assert (server.attributes or {})["rpc.grpc.status_code"] == 5


@pytest.fixture
def sampled_at_zero() -> Iterator[InMemorySpanExporter]:
    """The sidecar's sampler at ratio 0: only a host's sampled trace is recorded."""
    sampler = ratio_sampler(0.0)
    with installed(TracerProvider(sampler=sampler)) as exporter:
        yield exporter


def test_at_ratio_zero_a_trace_starting_here_exports_nothing_and_makes_no_inner_span(
    sampled_at_zero: InMemorySpanExporter,
) -> None:
    opened = tracing.start_rpc(METHOD, lambda: None)
    assert opened is not None
    server, _ = opened
    assert not server.is_recording()
    # Current, so that what runs under it knows the trace is not sampled.
    assert trace.get_current_span() is server
    with tracing.span("db.transaction") as inner:
        assert inner is None
        assert trace.get_current_span() is server
    tracing.end_rpc(opened, "NOT_FOUND", 5)
    assert not trace.get_current_span().get_span_context().is_valid
    # An internal span starting a trace of its own (an MCP session's work) is dropped too.
    with tracing.span("mcp.call_tool") as root:
        assert root is None
    assert sampled_at_zero.get_finished_spans() == ()


def test_at_ratio_zero_a_call_continuing_a_sampled_trace_is_exported_with_its_attributes(
    sampled_at_zero: InMemorySpanExporter,
) -> None:
    opened = tracing.start_rpc(METHOD, lambda: (("traceparent", TRACEPARENT),))
    with tracing.span("db.transaction") as inner:
        assert inner is not None
        inner.set_attributes({"psych.write": True})
    tracing.end_rpc(opened, "OK", 0)
    inner_span, server = sampled_at_zero.get_finished_spans()
    assert format(server.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert dict(server.attributes or {}) == {
        "rpc.system": "grpc",
        "rpc.service": "psych.sidecar.v1.RunService",
        "rpc.method": "GetRun",
        "rpc.grpc.status_code": 0,
    }
    assert inner_span.parent is not None
    assert inner_span.parent.span_id == server.context.span_id
    assert dict(inner_span.attributes or {}) == {"psych.write": True}


def test_a_host_trace_not_sampled_is_not_sampled_here_at_any_ratio() -> None:
    exporter = InMemorySpanExporter()
    sampler = ratio_sampler(1.0)
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        unsampled = TRACEPARENT.removesuffix("-01") + "-00"
        opened = tracing.start_rpc(METHOD, lambda: (("traceparent", unsampled),))
        with tracing.span("db.transaction") as inner:
            assert inner is None
        tracing.end_rpc(opened, "OK", 0)
        # A trace starting here is sampled at ratio 1.
        tracing.end_rpc(tracing.start_rpc(METHOD, lambda: None), "OK", 0)
    finally:
        tracing.uninstall()
        provider.shutdown()
    (server,) = exporter.get_finished_spans()
    assert server.parent is None


def test_the_sampler_setting_beats_the_standard_variables_which_beat_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    default = tracing.sampler(None)
    assert isinstance(default, ParentBased)
    assert description(default) == description(ParentBased(TraceIdRatioBased(0.1)))
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    # None: the SDK's provider reads OTEL_TRACES_SAMPLER (and its _ARG) itself.
    assert tracing.sampler(None) is None
    assert TracerProvider(sampler=tracing.sampler(None)).sampler is ALWAYS_ON
    configured = tracing.sampler(0.25)
    assert configured is not None
    assert description(configured) == description(ParentBased(TraceIdRatioBased(0.25)))


def test_tracing_off_makes_nothing() -> None:
    # Tracing off (no provider installed) inside a span of the host's own, from a provider of
    # its own: the helpers must neither make a span nor touch the one that is current.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("host").start_as_current_span("host.work") as outer:
        assert tracing.tracer() is None
        assert tracing.start_rpc(METHOD, lambda: (("traceparent", TRACEPARENT),)) is None
        assert trace.get_current_span() is outer
        with tracing.span("db.transaction") as nothing:
            assert nothing is None
            assert trace.get_current_span() is outer
        tracing.end_rpc(None, "NOT_FOUND", 5)
        assert trace.get_current_span() is outer
        assert outer.is_recording()
    (host_span,) = exporter.get_finished_spans()
    provider.shutdown()
    assert host_span.name == "host.work"
    assert dict(host_span.attributes or {}) == {}
    assert host_span.status.status_code == StatusCode.UNSET


def test_a_trace_starting_here_is_sampled_by_its_trace_id_as_the_ratio_sampler_says() -> None:
    # The sidecar decides an RPC's root span from its trace id itself (the sampler's own rule);
    # a sampled one is then made by the SDK with that very trace id.
    ratio = TraceIdRatioBased(0.5)
    sampler = ratio_sampler(0.5)
    recorded: set[int] = set()
    dropped: set[int] = set()
    with installed(TracerProvider(sampler=sampler)) as exporter:
        for _ in range(1000):
            opened = tracing.start_rpc(METHOD, lambda: None)
            assert opened is not None
            server, _ = opened
            trace_id = server.get_span_context().trace_id
            assert server.get_span_context().is_valid
            sampled = server.is_recording()
            assert sampled == (trace_id & ratio.TRACE_ID_LIMIT < ratio.bound)
            with tracing.span("db.transaction") as inner:
                assert (inner is not None) == sampled
            tracing.end_rpc(opened, "OK", 0)
            (recorded if sampled else dropped).add(trace_id)
        # A root span of the sidecar's own work after them draws a trace id of its own.
        with tracing.span("mcp.call_tool") as root:
            other = root.get_span_context().trace_id if root is not None else None
        finished = exporter.get_finished_spans()
    # Half of them, as the ratio says (a quarter if the SDK drew a trace id of its own and
    # decided again; both are 8 standard deviations from 375).
    assert 375 < len(recorded) < 625
    servers = [span for span in finished if span.kind == SpanKind.SERVER]
    assert {span.context.trace_id for span in servers} == recorded
    assert all(span.parent is None for span in servers)
    assert other not in recorded | dropped

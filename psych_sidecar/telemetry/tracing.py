"""OpenTelemetry traces: off unless the sidecar installs a tracer provider.

The sidecar keeps its own provider rather than the OpenTelemetry global (which can be set
once per process): `install` and `uninstall` swap the tracer every span here comes from.
With tracing off, `tracer()` is None and every helper is a no-op costing one check.

A W3C `traceparent` in a call's gRPC metadata makes the call's server span a child of the
host's span; storage transactions, MCP calls and prompt assembly nest under it (the storage
thread pool carries the context across: `api/servicers.Blocking`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from psych_sidecar import __version__

_NAME = "psych_sidecar"
_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: Tracer | None = None

AttributeValue = str | bool | int | float


def tracer() -> Tracer | None:
    return _tracer


def install(provider: trace.TracerProvider) -> None:
    global _tracer
    _tracer = provider.get_tracer(_NAME, __version__)


def uninstall() -> None:
    global _tracer
    _tracer = None


def otlp_provider() -> TracerProvider:
    """A provider exporting by OTLP/gRPC in batches, configured by the standard variables
    (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, …_HEADERS, …_TIMEOUT,
    OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, …)."""
    resource = Resource.create(
        {
            "service.name": os.environ.get("OTEL_SERVICE_NAME", "psych-sidecar"),
            "service.version": __version__,
        }
    )
    provider = TracerProvider(resource=resource)
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "none":
        # Spans are made, ended and handed to a sink that drops them: the instrumentation's
        # own cost, with nothing to batch or send.
        provider.add_span_processor(SimpleSpanProcessor(_Discard()))
    elif exporter in ("", "otlp"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r}: only otlp and none are supported")
    return provider


class _Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def start_rpc(
    method: str, metadata: Callable[[], Iterable[tuple[str, str | bytes]] | None]
) -> tuple[Span, object] | None:
    """Open the span of one RPC and make it current, continuing the caller's trace when its
    metadata (read only when tracing) carries a W3C `traceparent`; `method` is the full name
    (`/pkg.Service/Method`).
    None when tracing is off. Close it with `end_rpc`, in the same context."""
    current = _tracer
    if current is None:
        return None
    parent = None
    pairs = metadata() or ()
    for key, value in pairs:
        if key == "traceparent" and isinstance(value, str):
            carrier = {k: v for k, v in pairs if isinstance(v, str)}
            parent = _PROPAGATOR.extract(carrier)
            break
    name = method.lstrip("/")
    service, _, rpc_method = name.partition("/")
    span = current.start_span(
        name,
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc_method},
        record_exception=False,
        set_status_on_exception=False,
    )
    return span, otel_context.attach(trace.set_span_in_context(span))


def end_rpc(opened: tuple[Span, object] | None, code_name: str, code_value: int) -> None:
    if opened is None:
        return
    span, token = opened
    span.set_attribute("rpc.grpc.status_code", code_value)
    if code_name != "OK":
        span.set_status(Status(StatusCode.ERROR, code_name))
    span.end()
    otel_context.detach(token)  # type: ignore[arg-type]


@contextlib.contextmanager
def span(
    name: str, attributes: Mapping[str, AttributeValue] | None = None
) -> Iterator[Span | None]:
    """An internal span (a child of the current one), or nothing when tracing is off.
    An exception escaping it marks it as an error."""
    current = _tracer
    if current is None:
        yield None
        return
    with current.start_as_current_span(name, attributes=attributes) as opened:
        yield opened


def new_root() -> None:
    """Forget the current span in this context: a long-lived task started during a call
    (an MCP session's owner) starts its own traces rather than nesting under that call."""
    otel_context.attach(otel_context.Context())


def current_trace_id() -> str:
    """The current span's trace id in hex, or "" (for log lines)."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""

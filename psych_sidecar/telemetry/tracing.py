"""OpenTelemetry traces: off unless the sidecar installs a tracer provider.

The sidecar keeps its own provider rather than the OpenTelemetry global (which can be set
once per process): `install` and `uninstall` swap the tracer every span here comes from.
With tracing off, `tracer()` is None and every helper is a no-op costing one check.

Spans are sampled (`sampler`: by default parent-based, one root trace in ten). A trace that is
not sampled costs its RPC's non-recording span and nothing more: the internal helpers make no
span under it, and nothing builds attributes for a span that does not record. Under the
sampler `sampler` makes, an RPC that starts a trace is decided here, from its trace id as the
sampler would: one it drops costs two random ids and the span holding them (`_RatioRoots`).

A W3C `traceparent` in a call's gRPC metadata makes the call's server span a child of the
host's span; storage transactions, MCP calls and prompt assembly nest under it (the storage
thread pool carries the context across: `api/plumbing.Blocking`).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, cast

from psych_sidecar import __version__

if TYPE_CHECKING:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace import Tracer as SdkTracer
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.sdk.trace.sampling import Sampler, TraceIdRatioBased
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: TraceContextTextMapPropagator

_NAME = "psych_sidecar"
_tracer: trace.Tracer | None = None
_roots: _RatioRoots | None = None

AttributeValue = str | bool | int | float


def tracer() -> trace.Tracer | None:
    return _tracer


def _import_opentelemetry() -> None:
    """Bind the OpenTelemetry names the helpers below use. Imported when a provider is made
    or installed, not with this module: a sidecar with tracing off never imports OpenTelemetry
    (its SDK is a tenth of a start's imports), and every helper checks for a tracer first."""
    global otel_context, trace, _PROPAGATOR
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR = TraceContextTextMapPropagator()


def install(provider: trace.TracerProvider) -> None:
    global _tracer, _roots
    _import_opentelemetry()
    _tracer = provider.get_tracer(_NAME, __version__)
    _roots = _RatioRoots.of(_tracer, provider)


def uninstall() -> None:
    global _tracer, _roots
    _tracer = None
    _roots = None


# The share of root traces (calls without a sampled traceparent) sampled when neither the
# `tracing_sample_ratio` setting nor OTEL_TRACES_SAMPLER says: a host that propagates its
# trace gets every span of the traces it samples, and the sidecar's own traces cost a tenth.
DEFAULT_SAMPLE_RATIO = 0.1


def sampler(sample_ratio: float | None) -> Sampler | None:
    """The sampler for the `tracing_sample_ratio` setting: parent-based trace-id ratio at that
    ratio; unset, None (the SDK reads the standard OTEL_TRACES_SAMPLER and
    OTEL_TRACES_SAMPLER_ARG) when OTEL_TRACES_SAMPLER is set, else the same at
    DEFAULT_SAMPLE_RATIO."""
    if sample_ratio is None:
        if os.environ.get("OTEL_TRACES_SAMPLER", "").strip():
            return None
        sample_ratio = DEFAULT_SAMPLE_RATIO
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    root = TraceIdRatioBased(sample_ratio)
    made = ParentBased(root)
    _ratio_roots[made] = root
    return made


# The samplers `sampler` made, with the trace-id ratio sampler deciding their roots.
_ratio_roots: weakref.WeakKeyDictionary[Sampler, TraceIdRatioBased] = weakref.WeakKeyDictionary()


class _RatioRoots:
    """The spans of RPCs that start a trace (no `traceparent`) under a provider whose sampler
    `sampler` made, decided here as that sampler decides them (parent-based: a root goes to
    the trace-id ratio): the trace id is drawn first, by the provider's id generator, and one
    the ratio drops becomes a non-recording span at once, without the SDK's sampling call, its
    result objects and its span bookkeeping (most of a dropped span's cost). One it samples is
    made by the SDK with that same trace id (`_ChosenTraceIds`), so its sampler makes the
    decision again, alike, and the span is recorded as any other."""

    __slots__ = ("_bound", "_chosen", "_ids", "_limit", "_root_context", "_tracer", "_unsampled")

    def __init__(self, tracer: SdkTracer, ratio: TraceIdRatioBased) -> None:
        # What TraceIdRatioBased.should_sample compares: sampled when below the bound.
        self._limit, self._bound = ratio.TRACE_ID_LIMIT, ratio.bound
        current: object = tracer.id_generator
        if isinstance(current, _ChosenTraceIds):
            # The provider hands this tracer out again (it caches them): wrapped once.
            chosen = current
        else:
            chosen = _ChosenTraceIds(tracer.id_generator)
            tracer.id_generator = cast("IdGenerator", chosen)
        self._chosen = chosen
        self._ids = chosen.ids
        self._tracer = tracer
        self._root_context = otel_context.Context()
        # Read by nothing but `sampled` (no span of this process propagates or exports one).
        self._unsampled = trace.TraceFlags(trace.TraceFlags.DEFAULT)

    @classmethod
    def of(cls, tracer: trace.Tracer, provider: trace.TracerProvider) -> _RatioRoots | None:
        """For an SDK provider with a sampler of `sampler`'s making; else None: its sampler
        decides every span."""
        from opentelemetry.sdk.trace import Tracer as SdkTracer
        from opentelemetry.sdk.trace import TracerProvider

        if not isinstance(provider, TracerProvider) or not isinstance(tracer, SdkTracer):
            return None
        ratio = _ratio_roots.get(provider.sampler)
        return None if ratio is None else cls(tracer, ratio)

    def start(self, name: str, attributes: Mapping[str, AttributeValue]) -> trace.Span:
        trace_id = self._ids.generate_trace_id()
        if trace_id & self._limit >= self._bound:
            span_context = trace.SpanContext(
                trace_id, self._ids.generate_span_id(), False, self._unsampled
            )
            return trace.NonRecordingSpan(span_context)
        self._chosen.choose(trace_id)
        try:
            return _server_span(self._tracer, name, self._root_context, attributes)
        finally:
            self._chosen.choose(0)


class _ChosenTraceIds:
    """The id generator of the sidecar's tracer under a sampler of `sampler`'s making (the
    SDK's IdGenerator interface): the trace id chosen beforehand in this thread, once, when
    one is (`_RatioRoots`); otherwise, and for span ids, the provider's generator's."""

    __slots__ = ("_chosen", "ids")

    def __init__(self, ids: IdGenerator) -> None:
        self.ids = ids
        self._chosen = threading.local()

    def choose(self, trace_id: int) -> None:
        """The next trace id made in this thread (0: none chosen)."""
        self._chosen.trace_id = trace_id

    def generate_trace_id(self) -> int:
        chosen: int = getattr(self._chosen, "trace_id", 0)
        if chosen:
            self._chosen.trace_id = 0
            return chosen
        return self.ids.generate_trace_id()

    def generate_span_id(self) -> int:
        return self.ids.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return self.ids.is_trace_id_random()


def otlp_provider(sample_ratio: float | None = None) -> TracerProvider:
    """A provider exporting by OTLP/gRPC in batches, configured by the standard variables
    (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, …_HEADERS, …_TIMEOUT,
    OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, …) and sampling as
    `sampler` says."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {
            "service.name": os.environ.get("OTEL_SERVICE_NAME", "psych-sidecar"),
            "service.version": __version__,
        }
    )
    provider = TracerProvider(resource=resource, sampler=sampler(sample_ratio))
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "none":
        # Spans are made, ended and handed in batches to a sink that drops them: the cost
        # of tracing as production runs it (the same batch processor as OTLP), minus
        # encoding and sending.
        provider.add_span_processor(BatchSpanProcessor(_discarding_exporter()))
    elif exporter in ("", "otlp"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r}: only otlp and none are supported")
    return provider


def _discarding_exporter() -> SpanExporter:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return Discard()


# Per RPC method: its span's name and constant attributes, made once (the set of methods is
# the contract's). The SDK copies attributes into the span, so one dict serves every call.
_rpc_spans: dict[str, tuple[str, dict[str, AttributeValue]]] = {}


def _rpc_span(method: str) -> tuple[str, dict[str, AttributeValue]]:
    named = _rpc_spans.get(method)
    if named is None:
        name = method.lstrip("/")
        service, _, rpc_method = name.partition("/")
        named = name, {"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc_method}
        _rpc_spans[method] = named
    return named


def start_rpc(
    method: str, metadata: Callable[[], Iterable[tuple[str, str | bytes]] | None]
) -> tuple[trace.Span, object] | None:
    """Open the span of one RPC and make it current, continuing the caller's trace when its
    metadata (read only when tracing) carries a W3C `traceparent`; `method` is the full name
    (`/pkg.Service/Method`); without one, the call starts a trace. Current even when not sampled
    (a non-recording span), so that what runs under it knows its trace is not sampled.
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
    name, attributes = _rpc_span(method)
    roots = _roots
    if parent is None and roots is not None:
        span = roots.start(name, attributes)
    else:
        span = _server_span(current, name, parent, attributes)
    return span, otel_context.attach(trace.set_span_in_context(span))


def _server_span(
    tracer: trace.Tracer,
    name: str,
    parent: otel_context.Context | None,
    attributes: Mapping[str, AttributeValue],
) -> trace.Span:
    """An RPC's server span, not made current; `end_rpc` sets its status and ends it."""
    return tracer.start_span(
        name,
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    )


def end_rpc(opened: tuple[trace.Span, object] | None, code_name: str, code_value: int) -> None:
    if opened is None:
        return
    span, token = opened
    if span.is_recording():
        span.set_attribute("rpc.grpc.status_code", code_value)
        if code_name != "OK":
            span.set_status(trace.Status(trace.StatusCode.ERROR, code_name))
        span.end()
    otel_context.detach(token)  # type: ignore[arg-type]


class _Internal:
    """The context manager of `span`: what the SDK's `start_as_current_span` does (the span
    current for the block, an escaping exception recorded and marking it an error, the span
    ended on exit), without its two generator-based context managers per span.

    Under a span of a trace that is not sampled it makes nothing: every standard sampler
    decides a trace's local spans alike (the parent-based ones follow the parent; trace-id
    ratio decides by the trace id they share; always-on would have sampled the parent), so
    the child would not record either and its sampling, ids and context are saved."""

    __slots__ = ("_attributes", "_name", "_span", "_token")

    def __init__(self, name: str, attributes: Mapping[str, AttributeValue] | None) -> None:
        self._name = name
        self._attributes = attributes
        self._span: trace.Span | None = None
        self._token: object = None

    def __enter__(self) -> trace.Span | None:
        current = _tracer
        if current is None:
            return None
        parent = trace.get_current_span().get_span_context()
        if parent.is_valid and not parent.trace_flags.sampled:
            return None
        opened = current.start_span(self._name, attributes=self._attributes)
        self._span = opened
        self._token = otel_context.attach(trace.set_span_in_context(opened))
        # A root span the sampler dropped stays current (its children are skipped), but is
        # given to no one to annotate.
        return opened if opened.is_recording() else None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        opened = self._span
        if opened is None:
            return
        otel_context.detach(self._token)  # type: ignore[arg-type]
        # Like the SDK: an Exception is an error; GeneratorExit, a cancellation (BaseException)
        # is not.
        if isinstance(error, Exception) and opened.is_recording():
            opened.record_exception(error)
            opened.set_status(
                trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
            )
        opened.end()


def span(name: str, attributes: Mapping[str, AttributeValue] | None = None) -> _Internal:
    """An internal span (a child of the current one), or nothing when tracing is off or the
    trace is not sampled: a context manager giving the span to annotate, None when it does not
    record (set attributes that cost anything to build on it, not in `attributes`). An
    exception escaping it marks it as an error."""
    return _Internal(name, attributes)


def new_root() -> None:
    """Forget the current span in this context: a long-lived task started during a call
    (an MCP session's owner) starts its own traces rather than nesting under that call.
    Nothing to forget while tracing is off: no span was made current."""
    if _tracer is None:
        return
    otel_context.attach(otel_context.Context())


def current_trace_id() -> str:
    """The current span's trace id in hex, or "" (for log lines; always while tracing is
    off)."""
    if _tracer is None:
        return ""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""

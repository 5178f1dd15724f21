"""Metrics, traces and JSON logs of the real sidecar after a scripted turn: a deferred MCP
call (ok, tool error, timeout), a large result elided in the next prompt, read back, usage
recorded. Metrics are scraped over HTTP from the admin listener; spans go to an in-memory
exporter; log lines through the JSON formatter."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import duration_pb2, struct_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    run_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    tool_service_pb2,
    turn_service_pb2,
    usage_service_pb2,
    usage_service_pb2_grpc,
)
from psych_sidecar.config import StdioCommand
from psych_sidecar.telemetry.logs import JsonFormatter
from psych_sidecar.telemetry.series import Series
from tests.support.connections import FIXTURE_SERVER
from tests.support.databases import TEST_SECRET_KEY
from tests.support.polling import wait_for
from tests.support.processes import free_port, served, wait_for_port
from tests.support.prompts import (
    append,
    assemble,
    assistant,
    history_results,
    run_with,
    thresholds,
)
from tests.support.requests import text_part, user
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

ALL_TOOLS = [spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")]
BIG = 40_000
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
TRACE_METADATA: tuple[tuple[str, str | bytes], ...] = (("traceparent", TRACEPARENT),)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# One transport is enough here; both databases run.
SIDECAR_TRANSPORTS = ["unix"]


@pytest.fixture(scope="module")
def spans(database_url: str) -> InMemorySpanExporter:
    """Where the sidecar's spans go: memory, exported as each span ends. One per sidecar
    (per database): a provider's shutdown stops its exporter."""
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def grpc_server(
    grpc_addr: str,
    database_url: str,
    spans: InMemorySpanExporter,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningSidecar]:
    """The real sidecar with an admin listener and tracing into `spans`."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    settings = flat_settings(
        listen=[f"unix://{grpc_addr.removeprefix('unix:')}"],
        admin_listen=["127.0.0.1:0"],
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("data"),
        shutdown_grace_seconds=5,
        secret_keys=TEST_SECRET_KEY,
        mcp_commands={
            "fixture": StdioCommand(
                argv=[sys.executable, str(FIXTURE_SERVER), "stdio", "--output-schema-faults"]
            ),
        },
    )
    with RunningSidecar(settings, tracer_provider=provider) as running:
        yield running
    provider.shutdown()


def scrape(running: RunningSidecar) -> Samples:
    assert running.sidecar.admin is not None
    with urllib.request.urlopen(running.sidecar.admin.bound[0] + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@dataclass
class Turn:
    """What the scripted turn left behind."""

    before: Samples
    after: Samples
    run_id: str
    handle: str
    connection: str

    def delta(self, name: str, **labels: str) -> float:
        return value(self.after, name, **labels) - value(self.before, name, **labels)


def call(
    stubs: Stubs, run_id: str, server: str, tool: str, call_id: str, timeout: float = 0, **args: Any
) -> tool_service_pb2.ToolOutcome:
    arguments = struct_pb2.Struct()
    arguments.update(args)
    request = tool_service_pb2.CallDeferredToolRequest(
        run_id=run_id, server=server, tool=tool, arguments=arguments, call_id=call_id
    )
    if timeout:
        request.timeout.CopyFrom(duration_pb2.Duration(nanos=int(timeout * 1e9)))
    return stubs.tools.CallDeferredTool(request, metadata=TRACE_METADATA).outcome


@pytest.fixture(scope="module")
def turn(
    grpc_server: RunningSidecar, stubs: Stubs, grpc_channel: Any, spans: InMemorySpanExporter
) -> Turn:
    """The scripted turn, between two scrapes."""
    before = scrape(grpc_server)
    tenant = "obs-tenant"
    connection = connection_pb2.Connection(
        tenant=tenant,
        name="fx",
        stdio=connection_pb2.StdioTransport(command="fixture"),
    )
    stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    )
    stubs.connections.RefreshCatalog(
        connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="fx")
    )
    run_id = run_with(
        stubs,
        "obs-agent",
        tenant=tenant,
        grants=ALL_TOOLS,
        thresholds=thresholds(per_result_tokens=1000),
    )
    append(stubs, run_id, user("fetch it"), assistant("", ("c1", "fx__huge_text", "{}")))
    big = call(stubs, run_id, "fx", "huge_text", "c1", size=BIG)
    assert not big.is_error
    failed = call(stubs, run_id, "fx", "tool_error", "c2")
    assert failed.is_error
    hung = call(stubs, run_id, "fx", "hang", "c3", timeout=0.3)
    assert hung.is_error
    # A result that breaks the tool's own output schema: the server's error.
    broken = call(stubs, run_id, "fx", "wrong_structured", "c4")
    assert broken.is_error
    append(stubs, run_id, user("now look closer"))
    prompt = stubs.turns.AssemblePrompt(
        turn_service_pb2.AssemblePromptRequest(run_id=run_id),
        metadata=TRACE_METADATA,
    )
    assert history_results(prompt)["c1"].elided
    read = stubs.tools.ReadToolOutput(
        tool_service_pb2.ReadToolOutputRequest(run_id=run_id, handle=big.handle, limit=100)
    )
    assert read.text
    usage = usage_service_pb2_grpc.UsageServiceStub(grpc_channel)
    record = usage_service_pb2.RecordUsageRequest(
        run_id=run_id,
        request_id="u1",
        model="m",
        input_tokens=100,
        cache_read_tokens=900,
        cache_write_tokens=50,
        output_tokens=30,
    )
    usage.RecordUsage(record)
    usage.RecordUsage(record)  # a retry: counted once
    rpc_failure(
        lambda: stubs.turns.ResolveTurn(turn_service_pb2.ResolveTurnRequest(run_id="run_nope"))
    )
    return Turn(before, scrape(grpc_server), run_id, big.handle, "fx")


RPC = "psych.sidecar.v1"


def test_rpcs_are_counted_and_timed_by_method_and_code(turn: Turn) -> None:
    call_deferred = f"{RPC}.ToolService/CallDeferredTool"
    assert turn.delta("psych_sidecar_rpcs_total", method=call_deferred, code="OK") == 4
    assert turn.delta("psych_sidecar_rpc_seconds_count", method=call_deferred, code="OK") == 4
    resolve = f"{RPC}.TurnService/ResolveTurn"
    assert turn.delta("psych_sidecar_rpcs_total", method=resolve, code="NOT_FOUND") == 1
    assemble_name = f"{RPC}.TurnService/AssemblePrompt"
    assert (
        turn.delta("psych_sidecar_rpc_seconds_bucket", method=assemble_name, code="OK", le="+Inf")
        == 1
    )


def test_tool_calls_by_connection_and_outcome(turn: Turn) -> None:
    for outcome in ("ok", "tool_error", "timeout", "server_error"):
        assert (
            turn.delta("psych_sidecar_mcp_tool_calls_total", connection="fx", outcome=outcome) == 1
        )
        assert (
            turn.delta(
                "psych_sidecar_mcp_tool_call_seconds_count", connection="fx", outcome=outcome
            )
            == 1
        )


def test_connection_state_refreshes_and_catalogue_size(turn: Turn) -> None:
    assert (
        value(turn.after, "psych_sidecar_connection_state", connection="fx", state="CONNECTED") == 1
    )
    assert (
        value(turn.after, "psych_sidecar_connection_state", connection="fx", state="UNREACHABLE")
        == 0
    )
    assert value(turn.after, "psych_sidecar_catalog_tools", connection="fx") > 5
    assert (
        turn.delta("psych_sidecar_catalog_refreshes_total", trigger="connect", outcome="changed")
        == 1
    )
    assert (
        turn.delta(
            "psych_sidecar_catalog_refreshes_total", trigger="on_demand", outcome="unchanged"
        )
        == 1
    )


def test_prompt_zones_elision_and_usage(turn: Turn) -> None:
    for zone in ("static_system", "dynamic_tail", "history", "transient"):
        assert turn.delta("psych_sidecar_prompt_zone_bytes_count", zone=zone) == 1
        assert turn.delta("psych_sidecar_prompt_zone_estimated_tokens_count", zone=zone) == 1
    assert turn.delta("psych_sidecar_prompt_zone_bytes_sum", zone="history") > 0
    assert turn.delta("psych_sidecar_results_elided_total", reason="prior_turn") == 1
    saved = turn.delta("psych_sidecar_elided_bytes_saved_total", reason="prior_turn")
    assert BIG - 8000 < saved < BIG
    for kind, tokens in (("input", 100), ("cache_read", 900), ("cache_write", 50), ("output", 30)):
        assert turn.delta("psych_sidecar_usage_tokens_total", kind=kind) == tokens


def test_compactions_are_counted_with_their_sizes(
    grpc_server: RunningSidecar, stubs: Stubs, turn: Turn
) -> None:
    before = scrape(grpc_server)
    policy = spec_pb2.CompactionPolicy(trigger_tokens=500, keep_recent_turns=0)
    run_id = run_with(stubs, "obs-compacting", compaction=policy)
    for number in range(2):
        append(stubs, run_id, user(f"q{number} " + "q" * 2_000), assistant("a" * 2_000))
    append(stubs, run_id, user("and now?"))
    proposal = assemble(stubs, run_id).compaction
    assert (proposal.first_sequence, proposal.last_sequence, proposal.required) == (1, 4, False)
    summary = run_pb2.Compaction(summary=[text_part("s" * 300)], first_sequence=1, last_sequence=4)
    append(stubs, run_id, run_pb2.Record(compaction=summary))
    after = scrape(grpc_server)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("psych_sidecar_compactions_proposed_total", urgency="due") == 1
    assert delta("psych_sidecar_compactions_total") == 1
    assert delta("psych_sidecar_compacted_records_sum") == 4
    assert delta("psych_sidecar_compaction_summary_bytes_sum") == 300


def test_both_loop_storage_outcomes_are_exported_before_either_is_counted() -> None:
    """Series made anew export `done` and `worker` at 0: the worker share can be graphed (and
    alerted on) before the first answer on a worker."""
    exposition = Series(()).exposition().decode()
    samples = {
        (sample.name, sample.labels.get("outcome")): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }
    for outcome in ("done", "worker"):
        assert samples[("psych_sidecar_loop_storage_attempts_total", outcome)] == 0


def test_storage_waits_and_loop_lag_are_measured(turn: Turn) -> None:
    assert turn.delta("psych_sidecar_storage_wait_seconds_count") > 0
    assert turn.delta("psych_sidecar_db_pool_wait_seconds_count") > 0
    assert ("psych_sidecar_event_loop_lag_seconds_count", frozenset()) in turn.after
    assert ("psych_sidecar_search_warmup_backlog", frozenset()) in turn.after


def test_no_label_carries_a_run_id_or_handle(turn: Turn) -> None:
    for _name, labels in turn.after:
        for _key, label_value in labels:
            assert not label_value.startswith(("run_", "h_")), label_value
            assert turn.run_id not in label_value
            assert turn.handle not in label_value


def _by_name(exported: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in exported if span.name == name]


def test_spans_continue_the_hosts_traceparent(turn: Turn, spans: InMemorySpanExporter) -> None:
    exported = spans.get_finished_spans()
    [server] = [
        s
        for s in _by_name(exported, f"{RPC}.TurnService/AssemblePrompt")
        if format(s.context.trace_id, "032x") == TRACE_ID
    ]
    assert server.parent is not None
    assert format(server.parent.span_id, "016x") == PARENT_SPAN_ID
    assert dict(server.attributes or {})["rpc.grpc.status_code"] == 0
    [assembly] = [
        s
        for s in _by_name(exported, "prompt.assemble")
        if s.context.trace_id == server.context.trace_id
    ]
    assert assembly.parent is not None
    assert assembly.parent.span_id == server.context.span_id
    attributes: dict[str, Any] = dict(assembly.attributes or {})
    assert attributes["psych.prompt.history.bytes"] > 0
    assert attributes["psych.prompt.elided_results"] == 1
    # Sizes, never content.
    assert all(not isinstance(v, str) for v in attributes.values())
    transactions = [
        s
        for s in _by_name(exported, "db.transaction")
        if s.parent is not None and s.parent.span_id == assembly.context.span_id
    ]
    assert transactions
    functions = {(s.attributes or {}).get("code.function") for s in transactions}
    assert "SqlLogReader.record_skeletons" in functions, functions


def test_mcp_calls_are_spans_with_server_tool_and_outcome(
    turn: Turn, spans: InMemorySpanExporter
) -> None:
    calls = {
        (s.attributes or {}).get("mcp.tool"): s
        for s in _by_name(spans.get_finished_spans(), "mcp.call_tool")
        if format(s.context.trace_id, "032x") == TRACE_ID
    }
    assert {tool: (calls[tool].attributes or {})["mcp.outcome"] for tool in calls} == {
        "huge_text": "ok",
        "tool_error": "tool_error",
        "hang": "timeout",
        "wrong_structured": "server_error",
    }
    assert all((s.attributes or {})["mcp.server"] == "fx" for s in calls.values())


def test_a_call_without_traceparent_starts_a_new_trace(
    turn: Turn, stubs: Stubs, spans: InMemorySpanExporter
) -> None:
    spans.clear()
    stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=turn.run_id))
    [server] = _by_name(spans.get_finished_spans(), f"{RPC}.RunService/GetRun")
    assert server.parent is None
    assert format(server.context.trace_id, "032x") != TRACE_ID


def test_json_logs_carry_the_rpc_run_id_and_trace_id(
    turn: Turn, stubs: Stubs, unique: Callable[[str], str]
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("psych_sidecar.api.rpc")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        stubs.runs.ListRecords(
            run_service_pb2.ListRecordsRequest(run_id=turn.run_id),
            metadata=TRACE_METADATA,
        )
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    [line] = [x for x in lines if x.get("rpc") == f"{RPC}.RunService/ListRecords"]
    assert line["run_id"] == turn.run_id
    assert line["trace_id"] == TRACE_ID
    assert line["level"] == "DEBUG"
    assert "answered OK" in line["message"]


def test_serve_writes_json_lines_and_serves_metrics_from_its_flags(tmp_path: Path) -> None:
    """The operator's view: `serve --log-format json --admin-listen --tracing otlp`, every
    stderr line JSON, the call's line with its Run id and the host's trace id."""
    socket_path = tmp_path / "s.sock"
    port = free_port()
    # Tracing on, spans made and dropped (no collector here): the log lines carry trace ids.
    with served(
        "--listen",
        f"unix://{socket_path}",
        "--database-url",
        f"sqlite:///{tmp_path / 'db'}",
        "--log-format",
        "json",
        "--admin-listen",
        f"127.0.0.1:{port}",
        "--tracing",
        "otlp",
        env={"PSYCH_SIDECAR_LOG_LEVEL": "DEBUG", "OTEL_TRACES_EXPORTER": "none"},
    ) as sidecar:
        wait_for_port(port, sidecar.process)
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            failure = rpc_failure(
                lambda: run_service_pb2_grpc.RunServiceStub(channel).GetRun(
                    run_service_pb2.GetRunRequest(run_id="run_unknown"),
                    timeout=10,
                    metadata=TRACE_METADATA,
                )
            )
        assert failure.info.reason == "RUN_NOT_FOUND"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            scraped = response.read().decode()
        samples = {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(scraped)
            for sample in family.samples
        }
        labels = {"method": f"{RPC}.RunService/GetRun", "code": "NOT_FOUND"}
        assert value(samples, "psych_sidecar_rpcs_total", **labels) == 1
    lines = [json.loads(line) for line in sidecar.log.splitlines()]
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    [answered] = [line for line in lines if line.get("run_id") == "run_unknown"]
    assert answered["rpc"] == f"{RPC}.RunService/GetRun"
    assert "NOT_FOUND" in answered["message"]
    assert answered["trace_id"] == TRACE_ID


MONITORING = Path(__file__).parent.parent / "deploy" / "monitoring"
METRIC_NAME = re.compile(r"\bpsych_sidecar_[a-z0-9_]+")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def exported_names(running: RunningSidecar) -> set[str]:
    """Every sample name the sidecar exports (its families and their suffixes), whether
    or not a labelled child exists yet."""
    assert running.sidecar.admin is not None
    with urllib.request.urlopen(running.sidecar.admin.bound[0] + "/metrics", timeout=10) as r:
        families = list(text_string_to_metric_families(r.read().decode()))
    return {
        family.name + suffix for family in families for suffix in SUFFIXES.get(family.type, ("",))
    }


def test_the_dashboard_and_alerts_name_only_metrics_that_exist(
    grpc_server: RunningSidecar,
) -> None:
    exported = exported_names(grpc_server)
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    exprs += [rule["expr"] for group in rules["spec"]["groups"] for rule in group["rules"]]
    named = {name for expr in exprs for name in METRIC_NAME.findall(expr)}
    assert named
    assert named <= exported, named - exported
    # The panels the operator needs are there.
    titles = " | ".join(panel["title"] for panel in dashboard["panels"])
    for needed in ("RPC latency", "Tool-call errors", "Cache-read share", "Elision", "states"):
        assert needed in titles


def test_every_exported_metric_is_documented(grpc_server: RunningSidecar) -> None:
    operations = (Path(__file__).parent.parent / "docs" / "operations.md").read_text()
    families = {
        name.removesuffix("_total")
        for name in exported_names(grpc_server)
        if name.startswith("psych_sidecar_")
        and not name.endswith(("_bucket", "_sum", "_count", "_created"))
    }
    for family in families:
        documented = f"`{family}`" in operations or f"`{family}_total`" in operations
        assert documented, family


def test_a_list_changed_refresh_is_counted_by_its_trigger(
    grpc_server: RunningSidecar, turn: Turn, stubs: Stubs
) -> None:
    before = value(
        scrape(grpc_server),
        "psych_sidecar_catalog_refreshes_total",
        trigger="list_changed",
        outcome="changed",
    )
    # The server adds a tool and announces tools/list_changed: one debounced refresh.
    call(stubs, turn.run_id, "fx", "add_tool", "c-notify", name="announced_tool")
    wait_for(
        lambda: (
            value(
                scrape(grpc_server),
                "psych_sidecar_catalog_refreshes_total",
                trigger="list_changed",
                outcome="changed",
            )
            == before + 1
        ),
        "a list_changed refresh counted",
    )


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace collector in the test process: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, str], Any]] = []
        self._lock = threading.Lock()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = {
                    attribute.key: attribute.value.string_value
                    for attribute in resource_spans.resource.attributes
                }
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((resource, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def test_serve_exports_spans_by_otlp_to_the_collector_the_environment_names(
    tmp_path: Path,
) -> None:
    """`--tracing otlp` with the standard OTEL_* variables: the RPC's span reaches an
    in-process collector as a child of the host's traceparent. At `--tracing-sample-ratio 0`
    that is the only one: a call starting its own trace is not sampled."""
    collector = _Collector()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    socket_path = tmp_path / "s.sock"
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_SERVICE_NAME": "sidecar-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_TRACES_EXPORTER": None,
    }
    try:
        # Stopping flushes the batch of spans to the collector.
        with (
            served(
                "--listen",
                f"unix://{socket_path}",
                "--database-url",
                f"sqlite:///{tmp_path / 'db'}",
                "--tracing",
                "otlp",
                "--tracing-sample-ratio",
                "0",
                env=env,
            ),
            grpc.insecure_channel(f"unix:{socket_path}") as channel,
        ):
            runs = run_service_pb2_grpc.RunServiceStub(channel)
            rpc_failure(
                lambda: runs.GetRun(
                    run_service_pb2.GetRunRequest(run_id="run_traced"),
                    timeout=10,
                    metadata=TRACE_METADATA,
                )
            )
            rpc_failure(
                lambda: runs.GetRun(run_service_pb2.GetRunRequest(run_id="run_own"), timeout=10)
            )
    finally:
        server.stop(None)
    exported = [
        (resource, span)
        for resource, span in collector.spans
        if span.name == f"{RPC}.RunService/GetRun"
    ]
    [(resource, span)] = exported
    assert span.trace_id.hex() == TRACE_ID
    assert span.parent_span_id.hex() == PARENT_SPAN_ID
    assert resource["service.name"] == "sidecar-under-test"


def test_context_guard_elisions_are_counted_under_their_own_reason(
    grpc_server: RunningSidecar, turn: Turn, stubs: Stubs
) -> None:
    before = scrape(grpc_server)
    append(stubs, turn.run_id, user("and now this"))
    append(stubs, turn.run_id, assistant("", ("g1", "fx__huge_text", "{}")))
    call(stubs, turn.run_id, "fx", "huge_text", "g1", size=BIG)
    # A window too small for the current turn's result in full: the guard elides it.
    small = spec_pb2.ContextBudget(context_window_tokens=8_000, output_reserve_tokens=1_000)
    prompt = stubs.turns.AssemblePrompt(
        turn_service_pb2.AssemblePromptRequest(run_id=turn.run_id, context_budget=small)
    )
    assert len(prompt.context_guard.elided) == 1
    after = scrape(grpc_server)

    def delta(name: str, reason: str) -> float:
        return value(after, name, reason=reason) - value(before, name, reason=reason)

    assert delta("psych_sidecar_results_elided_total", "context_guard") == 1
    assert BIG - 8000 < delta("psych_sidecar_elided_bytes_saved_total", "context_guard") < BIG
    # The earlier turn's result is still elided by the rules.
    assert delta("psych_sidecar_results_elided_total", "prior_turn") >= 1

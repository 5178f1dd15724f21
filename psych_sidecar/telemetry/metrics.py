"""Prometheus metrics: recording at the edges, and /metrics. The series themselves
(`telemetry/series.py`, with prometheus_client) are made when recording is enabled.

Recorded at the edges (servicers, the RPC interceptors, the MCP layer, the storage thread pool);
the domain never sees this module. Labels are bounded: method, status code, connection
name, outcome, trigger, zone, kind; never a Run id, a handle or a tenant-supplied free text.

This module must not import the token estimator (the metering contract in pyproject.toml):
estimated tokens arrive here as numbers computed by the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from psych_sidecar.telemetry.series import LoopOutcome, Series


class StateSource(Protocol):
    """What a running sidecar tells the scrape about its current state."""

    def connection_states(self) -> Iterable[tuple[str, str]]:
        """(connection name, state name) of every connection this sidecar holds."""
        ...

    def catalog_sizes(self) -> Iterable[tuple[str, int]]:
        """(connection name, tools in its current catalogue) as last listed."""
        ...

    def warmup_backlog(self) -> int:
        """Tool texts queued for the search warm-up, not yet encoded or read."""
        ...


# The running sidecars the scrape reads (see `watch`).
_SOURCES: weakref.WeakSet[StateSource] = weakref.WeakSet()


def watch(source: StateSource) -> Callable[[], None]:
    """Report a running sidecar's state at every scrape; call the result to stop."""
    _SOURCES.add(source)
    return lambda: _SOURCES.discard(source)


# Recording is off until a sidecar with an admin listener enables it (nothing would read
# the numbers otherwise); process-wide, and never turned off again. The series (and
# prometheus_client) are made then: None, nothing is recorded.
_series: Series | None = None


def enable() -> Series:
    """Turn recording on (once a process, for good); the series recorded in."""
    global _series
    if _series is None:
        from psych_sidecar.telemetry.series import Series

        _series = Series(_SOURCES)
    return _series


# Recording helpers, so callers need not know label names; each costs one check when off.


def record_rpc(method: str, code: str, seconds: float) -> None:
    if _series is not None:
        _series.rpc_seconds.observe(seconds, (method, code))


def record_storage_wait(seconds: float) -> None:
    if _series is not None:
        _series.storage_wait_seconds.observe(seconds)


def record_loop_attempt(outcome: LoopOutcome) -> None:
    if _series is not None:
        _series.loop_attempt_outcomes[outcome].inc()


def record_pool_wait(seconds: float) -> None:
    if _series is not None:
        _series.db_pool_wait_seconds.observe(seconds)


def record_tool_call(connection: str, outcome: str, seconds: float) -> None:
    if _series is None:
        return
    _series.tool_calls.labels(connection, outcome).inc()
    _series.tool_call_seconds.labels(connection, outcome).observe(seconds)


def record_refresh(trigger: str, outcome: str) -> None:
    if _series is None:
        return
    _series.catalog_refreshes.labels(trigger, outcome).inc()


def record_prompt(
    zones: Sequence[tuple[str, int, int]], elisions: Mapping[str, tuple[int, int]]
) -> None:
    """Zones as (zone, bytes, estimated tokens); elisions as reason -> (results, bytes saved),
    the reasons being prior_turn, context_guard and current_turn_cap."""
    if _series is None:
        return
    for zone, size, tokens in zones:
        _series.prompt_bytes.labels(zone).observe(size)
        _series.prompt_tokens.labels(zone).observe(tokens)
    for reason, (count, saved) in elisions.items():
        if count:
            _series.results_elided.labels(reason).inc(count)
            _series.elided_bytes_saved.labels(reason).inc(saved)


def record_compaction(covered_records: int, summary_bytes: int) -> None:
    """A compaction record appended: how many records its summary stands for, and its size."""
    if _series is None:
        return
    _series.compactions.inc()
    _series.compacted_records.observe(covered_records)
    _series.compaction_summary_bytes.observe(summary_bytes)


def record_compaction_proposed(urgency: str) -> None:
    """An AssemblePrompt response proposing a compaction: `due` or `required`."""
    if _series is not None:
        _series.compactions_proposed.labels(urgency).inc()


def record_usage(input_tokens: int, cache_read: int, cache_write: int, output: int) -> None:
    if _series is None:
        return
    for kind, value in (
        ("input", input_tokens),
        ("cache_read", cache_read),
        ("cache_write", cache_write),
        ("output", output),
    ):
        if value > 0:
            _series.usage_tokens.labels(kind).inc(value)


@contextlib.contextmanager
def timed_search() -> Iterator[None]:
    """Times a tool search (SearchTools), ranking included."""
    started = time.perf_counter()
    try:
        yield
    finally:
        if _series is not None:
            _series.search_seconds.observe(time.perf_counter() - started)


async def watch_loop_lag(interval: float = 0.5) -> None:
    """Runs until cancelled: how late each timer fires is the loop's lag."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        if _series is not None:
            _series.loop_lag_seconds.observe(max(0.0, loop.time() - due))


async def _metrics(request: Request) -> Response:
    from starlette.responses import Response

    series = enable()
    return Response(series.exposition(), media_type=series.content_type)


def admin_routes() -> list[BaseRoute]:
    """GET /metrics: the Prometheus text exposition of every series."""
    # Starlette comes with the admin listener, not with every sidecar.
    from starlette.routing import Route

    return [Route("/metrics", _metrics, methods=["GET"])]

"""The Run inspector at /ui on the admin listener: read-only, server-rendered HTML.

Pages (all GET):

- ``/ui``: Runs, newest first, filtered by tenant (``?tenant=``);
- ``/ui/runs/{run_id}``: the Run's timeline (one bar per model call, stacked by zone,
  provider usage overlaid, cache-read share, turn boundaries; in its table, each compaction
  as a row before the first call it shaped), the cache-miss explainer and its tool results
  per turn;
- ``/ui/runs/{run_id}/results/{handle}``: the reader panel, with ReadToolOutput's semantics
  (``offset``, ``limit``, ``grep``);
- ``/ui/connections?tenant=``: a tenant's connections: state, last error, catalogue versions
  and their diffs.

Safety: every value goes through Jinja2's autoescape (tool output and MCP servers' text are
untrusted); no script at all, the SVG is drawn on the server; the Content-Security-Policy
allows only this listener's own stylesheet; only clients on this machine are served unless
the operator sets ``admin_ui_allow_remote`` (the admin listener may be on the pod IP for
/metrics); connection secrets never reach the page (the
catalogue view hands connections over with them emptied, and the page shows no command
arguments, URL or headers either). Reads go through the domain's RunInspector on the
storage thread pool; nothing here writes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from datetime import datetime
from importlib import resources
from typing import Any, TypeVar

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from psych_sidecar.admin.charts import ZONE_NAMES, timeline_chart
from psych_sidecar.domain.errors import Reason, SidecarError
from psych_sidecar.domain.prompt import Zone
from psych_sidecar.domain.run_inspector import CompactionView, ModelCall, RunInspector, Timeline
from psych_sidecar.domain.runlog import ALL_TENANTS

T = TypeVar("T")
Blocking = Callable[..., Awaitable[Any]]

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_NOT_FOUND = {
    Reason.RUN_NOT_FOUND,
    Reason.INVALID_DEFERRED_HANDLE,
    Reason.CONNECTION_NOT_FOUND,
}
MAX_QUERY_CHARS = 1024


def is_local_client(host: str | None) -> bool:
    """Whether a client address is this machine: a Unix-socket client (no address) or a
    loopback IP (IPv4-mapped IPv6 included)."""
    if not host:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _when(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _environment() -> Environment:
    environment = Environment(
        loader=PackageLoader("psych_sidecar.admin", "templates"),
        autoescape=True,  # every template, whatever its name: all values are escaped
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["when"] = _when
    environment.globals["zone_names"] = ZONE_NAMES
    environment.globals["Zone"] = Zone
    environment.tests["compaction"] = lambda value: isinstance(value, CompactionView)
    return environment


class _BadRequest(Exception):
    pass


def _int_param(request: Request, name: str) -> int:
    raw = request.query_params.get(name, "") or "0"
    if not raw.isdigit() or len(raw) > 12:
        raise _BadRequest(f"{name} must be a whole number of at most 12 digits")
    return int(raw)


def _text_param(request: Request, name: str) -> str:
    value = request.query_params.get(name, "")
    if len(value) > MAX_QUERY_CHARS:
        raise _BadRequest(f"{name} is longer than {MAX_QUERY_CHARS} characters")
    return value


class InspectorPages:
    def __init__(self, inspector: RunInspector, blocking: Blocking, allow_remote: bool) -> None:
        self._inspector = inspector
        self._blocking = blocking
        self._allow_remote = allow_remote
        self._templates = _environment()
        self._css = (
            resources.files("psych_sidecar.admin").joinpath("static/inspector.css").read_bytes()
        )

    def _render(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        body = self._templates.get_template(template).render(**context)
        return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)

    def _refused(self, request: Request) -> HTMLResponse | None:
        """The pages show Run data: unless the operator allows it, only clients on this
        machine get them, even when the admin listener is on the pod IP for /metrics."""
        if self._allow_remote or is_local_client(request.client.host if request.client else None):
            return None
        return self._render(
            "error.html",
            403,
            title="Forbidden",
            message="The Run inspector answers clients on this machine only "
            "(set admin_ui_allow_remote to serve it beyond loopback).",
        )

    async def _page(
        self, request: Request, build: Callable[[], Awaitable[HTMLResponse]]
    ) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            return await build()
        except _BadRequest as error:
            return self._render("error.html", 400, title="Bad request", message=str(error))
        except SidecarError as error:
            status = 404 if error.reason in _NOT_FOUND else 400
            return self._render("error.html", status, title=error.reason.name, message=str(error))

    async def stylesheet(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        return Response(self._css, media_type="text/css", headers=SECURITY_HEADERS)

    async def runs(self, request: Request) -> Response:
        async def build() -> HTMLResponse:
            tenant = _text_param(request, "tenant")
            # The form's first option, and a bare /ui, send no tenant: every tenant's Runs.
            runs = await self._blocking(self._inspector.runs, tenant or ALL_TENANTS)
            tenants = await self._blocking(self._inspector.tenants)
            return self._render("runs.html", runs=runs, tenants=tenants, tenant=tenant)

        return await self._page(request, build)

    async def run(self, request: Request) -> Response:
        async def build() -> HTMLResponse:
            run_id = request.path_params["run_id"]
            timeline = await self._blocking(self._inspector.timeline, run_id)
            results = await self._blocking(self._inspector.tool_results, run_id)
            turns: dict[int, list[Any]] = {}
            for row in results:
                turns.setdefault(row.turn, []).append(row)
            return self._render(
                "run.html",
                timeline=timeline,
                run=timeline.run,
                chart=timeline_chart(timeline.calls),
                misses=[call for call in timeline.calls if call.miss is not None],
                rows=timeline_rows(timeline),
                turns=turns,
            )

        return await self._page(request, build)

    async def reader(self, request: Request) -> Response:
        async def build() -> HTMLResponse:
            run_id = request.path_params["run_id"]
            handle = request.path_params["handle"]
            offset = _int_param(request, "offset")
            limit = _int_param(request, "limit")
            grep = _text_param(request, "grep")
            run = await self._blocking(self._inspector.run, run_id)
            read = await self._blocking(self._inspector.read, run_id, handle, offset, limit, grep)
            return self._render(
                "reader.html",
                run=run,
                handle=handle,
                offset=offset,
                limit=limit,
                grep=grep,
                read=read,
            )

        return await self._page(request, build)

    async def connections(self, request: Request) -> Response:
        async def build() -> HTMLResponse:
            tenant = _text_param(request, "tenant")
            if not tenant:
                raise _BadRequest("tenant is required")
            views = await self._blocking(self._inspector.connections, tenant)
            return self._render("connections.html", tenant=tenant, connections=views)

        return await self._page(request, build)


def timeline_rows(timeline: Timeline) -> list[ModelCall | CompactionView]:
    """The timeline table's rows: the model calls, each compaction before the first call
    whose zone 3 it shaped (its journal entry compacted through the compaction's range; a
    compaction older than the newest calls shown comes first, one no call used yet last)."""
    rows: list[ModelCall | CompactionView] = []
    pending = list(timeline.compactions)
    for call in timeline.calls:
        while pending and pending[0].last_sequence <= call.entry.compacted_through:
            rows.append(pending.pop(0))
        rows.append(call)
    return rows + pending


def admin_routes(
    inspector: RunInspector, blocking: Blocking, allow_remote: bool = False
) -> list[BaseRoute]:
    """The inspector's routes for the admin listener. Without `allow_remote`, clients other
    than loopback and Unix-socket ones get 403."""
    pages = InspectorPages(inspector, blocking, allow_remote)
    return [
        Route("/ui", pages.runs, methods=["GET"]),
        Route("/ui/static/inspector.css", pages.stylesheet, methods=["GET"]),
        Route("/ui/runs/{run_id}", pages.run, methods=["GET"]),
        Route("/ui/runs/{run_id}/results/{handle}", pages.reader, methods=["GET"]),
        Route("/ui/connections", pages.connections, methods=["GET"]),
    ]

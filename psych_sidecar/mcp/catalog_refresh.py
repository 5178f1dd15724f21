"""One connection's catalogue: the tools/list walk (every page, each tool judged alone), storing
each complete listing as a catalogue version, and what triggers a refresh besides the sweep
(connecting, tools/list_changed). Refreshes are serialised per connection, whatever triggered
them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
import pydantic
from anyio.abc import TaskStatus
from mcp import Client, MCPError
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.dispatcher import CallOptions
from mcp.shared.inbound import find_invalid_x_mcp_header
from mcp_types import methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.catalog import (
    CatalogTool,
    CatalogWrite,
    ConnectionState,
    RejectedTool,
    rejected_tool,
    tool_definition_problem,
)
from psych_sidecar.mcp.session_state import SessionState, mcp_error
from psych_sidecar.mcp.session_types import CatalogUnavailable, Listing, SessionTimings
from psych_sidecar.telemetry import metrics

log = logging.getLogger(__name__)

# A tools/list walk stops here: a server whose cursors never end cannot hang a refresh.
MAX_LIST_PAGES = 10_000
# A warning about a listing's rejected tools names this many of them.
_REJECTIONS_LOGGED = 5


def _json(value: Any) -> bytes:
    if value is None:
        return b""
    return canonical_json(value)


def catalog_tool(server: str, tool: types.Tool) -> CatalogTool:
    annotations = (
        None
        if tool.annotations is None
        else tool.annotations.model_dump(by_alias=True, exclude_none=True, mode="json")
    )
    return CatalogTool(
        server=server,
        name=tool.name,
        description=tool.description or "",
        input_schema_json=_json(tool.input_schema),
        output_schema_json=_json(tool.output_schema),
        annotations_json=_json(annotations),
    )


async def _raw_tools_page(client: Client, cursor: str | None) -> Any:
    """One page of tools/list as the server sent it. The SDK's `list_tools` validates the page
    as a whole: one tool without an input schema `type` fails it, and every other tool with
    it. This is the same request (the session's own stamping and dispatcher) without that
    check, so that each tool is judged alone (`_judge_tool`)."""
    session = client.session
    request = types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=cursor))
    data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    options: CallOptions = {}
    session._stamp(data, options)
    return await session._dispatcher.send_raw_request(data["method"], data.get("params"), options)


def _list_ttl(page: Any) -> float | None:
    """A page's 2026-07-28 `ttlMs` in seconds (None: absent or not a number; negative: 0)."""
    ttl = page.get("ttlMs") if isinstance(page, dict) else None
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl != ttl:
        return None
    return max(float(ttl), 0.0) / 1000


def _first_problem(error: pydantic.ValidationError, within: tuple[object, ...] = ()) -> str:
    """The first of the error's problems under `within` (a location prefix, left out of the
    text), or ""."""
    for problem in error.errors():
        location = tuple(problem["loc"])
        if location[: len(within)] == within:
            where = ".".join(str(part) for part in location[len(within) :]) or "(entry)"
            return f"{where}: {problem['msg']}"
    return ""


def _surface_problem(version: str, entries: list[Any]) -> pydantic.ValidationError | None:
    """What the protocol version's own rules for a listing say of a page of these entries
    (None: nothing, or a version this SDK has no rules for)."""
    try:
        methods.validate_server_result("tools/list", version, {"tools": entries})
    except pydantic.ValidationError as error:
        return error
    except (KeyError, ValueError):
        pass
    return None


def _judge_tool(
    server: str, version: str, entry: Any, surface_checked: bool
) -> tuple[types.Tool, CatalogTool] | RejectedTool:
    """One listed tool, as the SDK would check it had it been listed alone, then by the
    catalogue's own rules; or why it is left out."""
    if not isinstance(entry, dict):
        return rejected_tool("", "the listing's entry is not a JSON object")
    name = entry.get("name")
    # What the rules say of the page itself (2026's cacheScope) is not the tool's.
    error = None if surface_checked else _surface_problem(version, [entry])
    if error is not None and (problem := _first_problem(error, ("tools", 0))):
        return rejected_tool(name, f"not a valid MCP tool: {problem}")
    try:
        tool = types.Tool.model_validate(entry, by_name=False)
    except pydantic.ValidationError as error:
        return rejected_tool(name, f"not a valid MCP tool: {_first_problem(error)}")
    if version in MODERN_PROTOCOL_VERSIONS and (
        header_problem := find_invalid_x_mcp_header(tool.input_schema)
    ):
        # The 2026 protocol has clients drop such a tool (the SDK would, silently).
        return rejected_tool(name, f"invalid x-mcp-header annotation: {header_problem}")
    catalogued = catalog_tool(server, tool)
    if problem := tool_definition_problem(catalogued):
        return rejected_tool(name, problem)
    return tool, catalogued


def _judge_page(
    server: str, version: str, entries: list[Any]
) -> list[tuple[types.Tool, CatalogTool] | RejectedTool]:
    """Every entry of a page, judged alone. The protocol's rules run once for the whole page
    when it passes them (nearly always: as costly as the SDK's own check), per entry when not."""
    whole = _surface_problem(version, entries)
    # Only the entries matter: what is said of the page itself (2026's cacheScope, which
    # this page of the entries alone lacks) is no entry's fault.
    checked = whole is None or not _first_problem(whole, ("tools",))
    return [_judge_tool(server, version, entry, checked) for entry in entries]


async def list_all_tools(client: Client, server: str) -> Listing:
    """Every page of tools/list, each tool judged alone: an invalid one is left out with its
    reason, the others are catalogued. A repeated tool name keeps its first listing."""
    judged: dict[str, CatalogTool | RejectedTool] = {}
    unnamed: list[RejectedTool] = []
    cursor: str | None = None
    seen_cursors: set[str] = set()
    version = client.protocol_version
    ttl: float | None = None
    long_running: set[str] = set()
    for _ in range(MAX_LIST_PAGES):
        page = await _raw_tools_page(client, cursor)
        if (page_ttl := _list_ttl(page)) is not None:
            # The listing is as fresh as its stalest page.
            ttl = page_ttl if ttl is None else min(ttl, page_ttl)
        entries = page.get("tools") if isinstance(page, dict) else None
        cursor = page.get("nextCursor") if isinstance(page, dict) else None
        if not isinstance(entries, list) or not isinstance(cursor, str | None):
            raise CatalogUnavailable("tools/list answered with something other than a listing")
        # Judging thousands of tools is CPU work: off the event loop, as a result's conversion.
        verdicts = await anyio.to_thread.run_sync(_judge_page, server, version, entries)
        valid: list[types.Tool] = []
        for verdict in verdicts:
            if isinstance(verdict, RejectedTool):
                if verdict.name:
                    judged.setdefault(verdict.name, verdict)
                else:
                    unnamed.append(verdict)
                continue
            tool, catalogued = verdict
            if judged.setdefault(tool.name, catalogued) is catalogued:
                valid.append(tool)
                execution = tool.execution
                if execution is not None and execution.task_support in ("optional", "required"):
                    long_running.add(tool.name)
        # The session keeps what it derives from a listing (2026 x-mcp-header maps, so a call
        # sends its Mcp-Param headers) from the valid tools only.
        session = client.session
        session._absorb_tool_listing(types.ListToolsResult(tools=valid), complete=False)
        if cursor is None:
            return Listing(
                [t for t in judged.values() if isinstance(t, CatalogTool)],
                [*unnamed, *(t for t in judged.values() if isinstance(t, RejectedTool))],
                ttl,
                frozenset(long_running),
            )
        if cursor in seen_cursors:
            raise CatalogUnavailable(f"tools/list repeated the cursor {cursor!r}")
        seen_cursors.add(cursor)
    raise CatalogUnavailable(f"tools/list did not end within {MAX_LIST_PAGES} pages")


def stale_after(list_ttl: float | None, timings: SessionTimings) -> float:
    """How long after a listing the next is due by its server's `ttlMs` (at least the floor),
    or inf when the server said nothing, or nothing sooner than the sweep's bound."""
    if list_ttl is None or list_ttl >= timings.catalog_ttl:
        return math.inf
    return max(list_ttl, timings.min_list_ttl)


class CatalogRefresh:
    """One connection's catalogue refreshes, over the live client its owner task keeps in
    `state`; `write_catalog` stores a listing (None: the connection was deleted)."""

    def __init__(
        self,
        state: SessionState,
        timings: SessionTimings,
        write_catalog: Callable[[Listing], Awaitable[CatalogWrite | None]],
    ) -> None:
        self._state = state
        self._timings = timings
        self._write_catalog = write_catalog
        self._lock = anyio.Lock()
        self._changed = anyio.Event()
        self.last_refresh = -math.inf
        # How long the last listing stays fresh by its server's word (None: it did not say).
        self.list_ttl: float | None = None
        # Tools in the last listing stored (for the catalogue-size gauge).
        self.catalog_size = 0
        # How the server delivers tools/list_changed, learnt on connect: "2026" on a
        # subscriptions/listen stream, "2025" unprompted (no listen); "" until known.
        self.protocol_era = ""
        # The tools the last listing declared long-running (they start as tasks).
        self._long_running: frozenset[str] = frozenset()
        # Tool name -> its output schema, as the server's last listing declared it.
        self._output_schemas: dict[str, bytes] = {}

    def output_schema(self, tool: str) -> bytes:
        """The tool's output schema as last listed (b"": none)."""
        return self._output_schemas.get(tool, b"")

    def long_running(self, tool: str) -> bool:
        """Whether the tool declared itself long-running when last listed."""
        return tool in self._long_running

    def new_session(self) -> None:
        """A session starts: changes announced on the last one are caught by its first
        listing."""
        self._changed = anyio.Event()

    def notice_change(self) -> None:
        """tools/list_changed arrived: a refresh follows (`refresh_on_change`)."""
        self._changed.set()

    # Run in the owner task's group, for the session's lifetime.

    async def listen(
        self, client: Client, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """2026-era servers deliver tools/list_changed only on a subscriptions/listen stream;
        2025-era ones send it unprompted to the message handler."""
        started = False
        key = self._state.key
        while True:
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    self.protocol_era = "2026"
                    if not started:
                        started = True
                        task_status.started()
                    async for _event in subscription:
                        self._changed.set()
            except ListenNotSupportedError:
                self.protocol_era = "2025"
                break
            except (MCPError, SubscriptionLost) as error:
                if (
                    not started
                    and isinstance(error, MCPError)
                    and error.code == types.METHOD_NOT_FOUND
                ):
                    # A server without subscriptions/listen sends list_changed unprompted,
                    # as in the 2025 protocol: expected, so said once, quietly.
                    if self.protocol_era != "2025":
                        log.debug(
                            "MCP connection %s/%s: no subscriptions/listen; list_changed "
                            "arrives unprompted (2025-era server)",
                            *key,
                        )
                    self.protocol_era = "2025"
                    break
                log.info(
                    "MCP connection %s/%s: listen ended: %s", *key, self._state.describe(error)
                )
                lost = isinstance(error, SubscriptionLost) or error.code == types.INTERNAL_ERROR
                if not started or not lost:
                    break
            # A stream that ended while the session lives is re-opened; changes meanwhile
            # are caught by a re-list.
            self._changed.set()
            await anyio.sleep(self._timings.reconnect_min)
        if not started:
            task_status.started()

    async def refresh_on_change(self) -> None:
        while True:
            await self._changed.wait()
            # Debounce: a burst of notifications becomes one listing.
            await anyio.sleep(self._timings.list_changed_debounce)
            self._changed = anyio.Event()
            await self._refresh_logged("list_changed", "tools/list_changed")

    async def refresh_when_stale(self) -> None:
        """Re-list when the server's `ttlMs` says the listing went stale, if that is sooner
        than the sweep's bound (which the sweep keeps in any case)."""
        while True:
            after = stale_after(self.list_ttl, self._timings)
            if math.isinf(after):
                # Nothing sooner than the sweep: look again after a listing could have said so.
                await anyio.sleep(self._timings.catalog_ttl)
                continue
            wait = self.last_refresh + after - anyio.current_time()
            if wait > 0:
                await anyio.sleep(wait)
                continue
            if not await self._refresh_logged("ttl", "the listing's ttlMs"):
                # Not again at once: the next try after the floor.
                await anyio.sleep(self._timings.min_list_ttl)

    async def _refresh_logged(self, trigger: str, after: str) -> bool:
        """A refresh of the session's own (`after` names what set it off), its failure logged:
        the next trigger tries again. Whether it succeeded."""
        try:
            await self.refresh(trigger)
        except Exception as error:
            log.warning(
                "MCP connection %s/%s: refresh after %s failed: %s",
                *self._state.key,
                after,
                self._state.describe(error),
            )
            return False
        return True

    # Called from request handlers and the sweep.

    async def refresh(self, trigger: str) -> CatalogWrite:
        """`trigger` (connect, ttl, on_demand, list_changed) labels the refresh's metric."""
        client = self._state.client
        if client is None or self._state.status.state is not ConnectionState.CONNECTED:
            metrics.record_refresh(trigger, "failed")
            raise CatalogUnavailable(self._state.unreachable_text())
        return await self.refresh_with(client, trigger)

    async def refresh_with(self, client: Client, trigger: str) -> CatalogWrite:
        """A refresh over `client`, connected or (on connect) not yet."""
        try:
            write = await self._list_and_write(client)
        except BaseException:
            metrics.record_refresh(trigger, "failed")
            raise
        metrics.record_refresh(trigger, "changed" if write.changed else "unchanged")
        return write

    async def _list_and_write(self, client: Client) -> CatalogWrite:
        state = self._state
        async with self._lock:
            refusals_before = state.refusals.count
            try:
                with anyio.fail_after(self._timings.connect_timeout):
                    listing = await list_all_tools(client, state.stored.connection.name)
            except Exception as error:
                if (failed := mcp_error(error)) and failed.code == types.CONNECTION_CLOSED:
                    state.broken.set()
                if (reason := state.authorization_required()) is not None:
                    # The server refused the listing as only the user can fix (a scope the
                    # tokens lack, tokens it will not take): as a refused call, the session
                    # ends and the state says why (`ToolCalls`).
                    state.set_authorization_required(reason)
                    state.broken.set()
                detail = state.describe(error, refusals_before)
                raise CatalogUnavailable(f"listing tools failed: {detail}") from None
            write = await self._write_catalog(listing)
            if write is None:
                raise CatalogUnavailable("the connection was deleted")
            if listing.rejected and write.changed:
                self._warn_rejected(listing)
            self.last_refresh = anyio.current_time()
            self.list_ttl = listing.ttl_seconds
            self._long_running = listing.long_running
            self.catalog_size = write.tool_count
            self._output_schemas = {
                tool.name: tool.output_schema_json
                for tool in listing.tools
                if tool.output_schema_json
            }
            return write

    def _warn_rejected(self, listing: Listing) -> None:
        """Said once per catalogue version that has them (a re-listing that finds the same
        ones writes no version)."""
        scrub = self._state.scrub
        shown = "; ".join(
            f"{scrub(item.name) or '(no name)'}: {scrub(item.reason)}"
            for item in listing.rejected[:_REJECTIONS_LOGGED]
        )
        more = len(listing.rejected) - _REJECTIONS_LOGGED
        log.warning(
            "MCP connection %s/%s: %s of its %d listed tools left out of the catalogue "
            "(invalid definitions): %s%s",
            *self._state.key,
            "all" if not listing.tools else str(len(listing.rejected)),
            len(listing.tools) + len(listing.rejected),
            shown,
            f"; and {more} more" if more > 0 else "",
        )

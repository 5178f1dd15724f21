"""One connection's MCP session, owned by one long-lived task.

The owner task enters and exits the SDK client (anyio cancel scopes must be exited by the
task that entered them); everyone else only calls into the live session, under a deadline.
The owner reconnects with backoff and keeps a visible state. Catalogue refreshes are
serialised per connection, whatever triggered them.
"""

from __future__ import annotations

import logging
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import mcp_types as types
import pydantic
from anyio.abc import TaskStatus
from mcp import Client, MCPError
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.dispatcher import CallOptions
from mcp.shared.inbound import find_invalid_x_mcp_header
from mcp_types import methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from psych_sidecar import __version__
from psych_sidecar.config import StdioCommand
from psych_sidecar.domain.calls import SchemaValidators
from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.catalog import (
    AuthorizationReason,
    CatalogTool,
    CatalogWrite,
    ConnectionState,
    McpToolResult,
    RejectedTool,
    Scrubber,
    StoredConnection,
    ToolCallFailed,
    authorization_line,
    rejected_tool,
    tool_definition_problem,
)
from psych_sidecar.mcp.oauth.grants import GrantAuth, TokenKeeper
from psych_sidecar.mcp.results import (
    output_schema_problem,
    schema_broken_result,
    small_result,
    tool_result,
)
from psych_sidecar.mcp.session_types import CatalogUnavailable, Listing, SessionTimings
from psych_sidecar.mcp.stderr import StderrTail
from psych_sidecar.mcp.stdio import LineTooLong, release_large_result
from psych_sidecar.mcp.transport import HttpRefusal, HttpRefusals, open_transport
from psych_sidecar.telemetry import logs, metrics, tracing

log = logging.getLogger(__name__)

# How a call fails when the server or the connection does: each is told to the model as what
# it is. Anything else raised during a call is a bug, and is logged as one.
_EXPECTED_CALL_FAILURES = (
    MCPError,
    TimeoutError,
    OSError,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    httpx2.TransportError,
    httpx2.HTTPStatusError,
    # A result that is not a CallToolResult: the server's garbage, not the sidecar's bug.
    pydantic.ValidationError,
)


def _expected(error: BaseException) -> bool:
    """Whether a call's failure is the server's or the connection's (every leaf of a group)."""
    if isinstance(error, BaseExceptionGroup):
        return all(_expected(leaf) for leaf in error.exceptions)
    return isinstance(error, _EXPECTED_CALL_FAILURES)


# How the sidecar introduces itself to every server. It declares no client capabilities: it
# offers no roots, no sampling and no elicitation (a server's question has no user to reach in
# the middle of a call), so a conforming server does not ask for them.
CLIENT_INFO = types.Implementation(name="psych-sidecar", version=__version__)

# A tools/list walk stops here: a server whose cursors never end cannot hang a refresh.
MAX_LIST_PAGES = 10_000
MAX_ERROR_CHARS = 500
# A warning about a listing's rejected tools names this many of them.
_REJECTIONS_LOGGED = 5


@dataclass(frozen=True, slots=True)
class SessionStatus:
    state: ConnectionState
    last_error: str
    state_time: datetime
    # Why it is AUTHORIZATION_REQUIRED; None in every other state.
    authorization_reason: AuthorizationReason | None = None


def describe_error(error: BaseException) -> str:
    """A one-line account of a failure, leaves of exception groups included."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(describe_error(e) for e in error.exceptions))
    if isinstance(error, TimeoutError):
        return "timed out"
    text = str(error) or type(error).__name__
    if isinstance(error, MCPError):
        text = f"MCP error {error.code}: {error.message}"
    return text[:MAX_ERROR_CHARS]


def _http_status_error(error: BaseException) -> bool:
    """Whether the error is an HTTP error status: httpx's, or the SDK's JSON-RPC stand-in for
    one (INTERNAL_ERROR "Server returned an error response", the status left out)."""
    if isinstance(error, BaseExceptionGroup):
        return any(_http_status_error(leaf) for leaf in error.exceptions)
    if isinstance(error, httpx2.HTTPStatusError):
        return True
    return isinstance(error, MCPError) and error.code == types.INTERNAL_ERROR


def _mcp_error(error: BaseException) -> MCPError | None:
    if isinstance(error, MCPError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _mcp_error(inner)
            if found is not None:
                return found
    return None


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
    server: str, version: str, entry: Any, surface_checked: bool = False
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
    for _ in range(MAX_LIST_PAGES):
        page = await _raw_tools_page(client, cursor)
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
        # The session keeps what it derives from a listing (2026 x-mcp-header maps, so a call
        # sends its Mcp-Param headers) from the valid tools only.
        session = client.session
        session._absorb_tool_listing(types.ListToolsResult(tools=valid), complete=False)
        if cursor is None:
            return Listing(
                [t for t in judged.values() if isinstance(t, CatalogTool)],
                [*unnamed, *(t for t in judged.values() if isinstance(t, RejectedTool))],
            )
        if cursor in seen_cursors:
            raise CatalogUnavailable(f"tools/list repeated the cursor {cursor!r}")
        seen_cursors.add(cursor)
    raise CatalogUnavailable(f"tools/list did not end within {MAX_LIST_PAGES} pages")


class ConnectionSession:
    """The owner of one connection's session. `run` is the owner task."""

    def __init__(
        self,
        stored: StoredConnection,
        commands: Mapping[str, StdioCommand],
        timings: SessionTimings,
        write_catalog: Callable[[Listing], Awaitable[CatalogWrite | None]],
        validators: SchemaValidators,
        keeper: Callable[[Scrubber], TokenKeeper] | None = None,
    ) -> None:
        self.stored = stored
        # Every error text and log line about this connection passes through it: a library
        # error may quote the URL, with its user-info and query (docs/security.md).
        self._scrub = Scrubber(stored.connection)
        self.stderr = StderrTail(f"{self.key[0]}/{self.key[1]}", self._scrub)
        # An OAuth connection's tokens (None for the others); it adds every token it holds to
        # the scrubber, so no error text or log line can quote one.
        self.keeper = keeper(self._scrub) if keeper is not None else None
        self._commands = commands
        self._timings = timings
        self._write_catalog = write_catalog
        # Results are judged against their tool's output schema here, not by the SDK.
        self._validators = validators
        # Tool name -> its output schema, as the server's last listing declared it.
        self._output_schemas: dict[str, bytes] = {}
        self._client: Client | None = None
        self._status = SessionStatus(ConnectionState.CONNECTING, "", datetime.now(UTC))
        self._stopping = anyio.Event()
        self._wake = anyio.Event()
        self._changed = anyio.Event()
        self._broken = anyio.Event()
        # Attempts that ended (connected or failed), and an event set when the next one does.
        self.finished_attempts = 0
        self._attempt_finished = anyio.Event()
        self._refresh_lock = anyio.Lock()
        self.last_refresh = -math.inf
        # Tools in the last listing stored (for the catalogue-size gauge).
        self.catalog_size = 0
        # How the server delivers tools/list_changed, learnt on connect: "2026" on a
        # subscriptions/listen stream, "2025" unprompted (no listen); "" until known.
        self.protocol_era = ""
        # Why the transport ended, when it said so (a stdio line over the limit).
        self._close_reason = ""
        # The current attempt's HTTP 401/403 answers, which the SDK reports only as
        # "Server returned an error response".
        self._refusals = HttpRefusals()

    def _describe(self, error: BaseException, refusals_before: int = 0) -> str:
        """The error, or the 401/403 behind it (see `_refusal`)."""
        refusal = self._refusal(error, refusals_before)
        return self._scrub(str(refusal) if refusal else describe_error(error))

    def _refusal(self, error: BaseException, refusals_before: int) -> HttpRefusal | None:
        """The server's 401 or 403 that `error` stands for: the error is an HTTP status error
        (or the SDK's status-less stand-in for one) and a refusal arrived since the
        attempt's first `refusals_before`."""
        if self._refusals.count > refusals_before and _http_status_error(error):
            return self._refusals.last
        return None

    @property
    def key(self) -> tuple[str, str]:
        return self.stored.connection.tenant, self.stored.connection.name

    @property
    def status(self) -> SessionStatus:
        return self._status

    def _set_status(
        self,
        state: ConnectionState,
        error: str = "",
        reason: AuthorizationReason | None = None,
    ) -> None:
        """The time changes only with the state, so a turn resolved during an outage reads
        the same state, time and (usually) error until the server is back."""
        previous = self._status
        if state is ConnectionState.CONNECTED:
            error = ""
        elif not error:
            error = previous.last_error
        if state is previous.state:
            if (error, reason) != (previous.last_error, previous.authorization_reason):
                self._status = SessionStatus(state, error, previous.state_time, reason)
            return
        self._status = SessionStatus(state, error, datetime.now(UTC), reason)

    def _authorization_required(self) -> AuthorizationReason | None:
        """Why the connection needs authorizing, when its keeper knows it does."""
        return self.keeper.required if self.keeper is not None else None

    def _set_authorization_required(self, reason: AuthorizationReason) -> None:
        if self._status.state is not ConnectionState.AUTHORIZATION_REQUIRED:
            log.warning("MCP connection %s/%s needs authorizing: %s", *self.key, reason.value)
        self._set_status(
            ConnectionState.AUTHORIZATION_REQUIRED,
            authorization_line(self.stored.connection.name, reason),
            reason,
        )

    def stop(self) -> None:
        self._stopping.set()

    def _finish_attempt(self) -> None:
        self.finished_attempts += 1
        finished, self._attempt_finished = self._attempt_finished, anyio.Event()
        finished.set()

    async def wait_attempt(self, after: int, wait_seconds: float) -> SessionStatus:
        """Wait until more than `after` attempts have ended, or `wait_seconds` passed."""
        with anyio.move_on_after(wait_seconds):
            while self.finished_attempts <= after and not self._stopping.is_set():
                await self._attempt_finished.wait()
        return self._status

    def reconnect_now(self) -> None:
        """Skip the rest of the backoff delay."""
        self._wake.set()

    # The owner task.

    async def run(self) -> None:
        delay = self._timings.reconnect_min
        name = self.stored.connection.name
        # This task's log lines name their connection, not the call that started it, and
        # its spans (refreshes) start traces of their own. Its context is its own: no reset.
        logs.bind_only(tenant=self.stored.connection.tenant, connection=name)
        tracing.new_root()
        while not self._stopping.is_set():
            # A server that was lost stays UNREACHABLE while it is retried: CONNECTING is
            # only the first attempt, so the state does not flap with every retry.
            if self._status.state not in (
                ConnectionState.UNREACHABLE,
                ConnectionState.AUTHORIZATION_REQUIRED,
            ):
                self._set_status(ConnectionState.CONNECTING)
            try:
                await self._connect_and_serve()
            except Exception as error:
                if (reason := self._authorization_required()) is not None:
                    # Nothing changes until someone signs in (here or on another sidecar,
                    # which the keeper reads at the next attempt): no backoff ramp, the
                    # longest delay; a sign-in here wakes it at once.
                    self._set_authorization_required(reason)
                    self._finish_attempt()
                    delay = self._timings.reconnect_max
                    await self._pause(delay)
                    continue
                detail = self._describe(error)
                # Each new failure is a warning; the same one again, retry after retry, is not.
                repeated = (
                    self._status.state is ConnectionState.UNREACHABLE
                    and self._status.last_error == detail
                )
                log.log(
                    logging.DEBUG if repeated else logging.WARNING,
                    "MCP connection %s/%s: %s",
                    self.key[0],
                    name,
                    detail,
                )
                self._set_status(ConnectionState.UNREACHABLE, detail)
                self._finish_attempt()
            else:
                if self._stopping.is_set():
                    break
                delay = self._timings.reconnect_min
                if (reason := self._authorization_required()) is not None:
                    self._set_authorization_required(reason)
                    delay = self._timings.reconnect_max
                    await self._pause(delay)
                    continue
                self._set_status(
                    ConnectionState.UNREACHABLE, self._close_reason or "the connection closed"
                )
            await self._pause(delay)
            delay = min(delay * 2, self._timings.reconnect_max)
        self._attempt_finished.set()

    async def _pause(self, delay: float) -> None:
        """Wait about `delay` before the next attempt, or until woken or stopped."""
        # Jitter keeps many sidecars from reconnecting to one server in lockstep.
        with anyio.move_on_after(delay * random.uniform(0.8, 1.2)):
            async with anyio.create_task_group() as group:
                group.start_soon(_set_when, self._stopping, group.cancel_scope)
                group.start_soon(_set_when, self._wake, group.cancel_scope)
        self._wake = anyio.Event()

    async def _connect_and_serve(self) -> None:
        closed = anyio.Event()
        self._close_reason = ""
        self._refusals = HttpRefusals()
        self._broken = anyio.Event()
        self._changed = anyio.Event()
        auth = None
        if self.keeper is not None:
            # No token, no attempt: a connection nobody signed in to is not a server outage.
            await self.keeper.access_token()
            auth = GrantAuth(self.keeper)
        transport = open_transport(
            self.stored.connection, self._commands, closed, self.stderr, self._refusals, auth
        )
        client = Client(
            transport,
            mode="auto",
            cache=None,
            message_handler=self._on_message,
            client_info=CLIENT_INFO,
        )
        deadline = anyio.current_time() + self._timings.connect_timeout
        try:
            with anyio.CancelScope(deadline=deadline) as connecting:
                async with client, anyio.create_task_group() as group:
                    _leave_results_to_the_sidecar(client)
                    # Subscribe before the first listing, so no change between them is lost.
                    await group.start(self._listen, client)
                    self._client = client
                    # Sync on connect: a notification sent during initialisation can be lost.
                    await self._refresh(client, "connect")
                    connecting.deadline = math.inf
                    self._set_status(ConnectionState.CONNECTED)
                    self._finish_attempt()
                    group.start_soon(self._refresh_on_change)
                    await _first_of(self._stopping, closed, self._broken)
                    # No new call may start on a session that is going away.
                    self._client = None
                    group.cancel_scope.cancel()
        finally:
            self._client = None
        if connecting.cancelled_caught:
            raise TimeoutError
        if self._broken.is_set() and not closed.is_set() and not self._stopping.is_set():
            raise CatalogUnavailable(self._status.last_error or "the session broke")

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._changed.set()
        elif isinstance(message, LineTooLong):
            # The transport ends after it: the reason the connection closed.
            self._close_reason = self._describe(message)
            log.warning("MCP connection %s/%s: %s", *self.key, self._close_reason)
        elif isinstance(message, Exception):
            log.info(
                "MCP connection %s/%s transport error: %s",
                *self.key,
                self._describe(message),
            )

    async def _listen(
        self, client: Client, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """2026-era servers deliver tools/list_changed only on a subscriptions/listen stream;
        2025-era ones send it unprompted to the message handler."""
        started = False
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
                            *self.key,
                        )
                    self.protocol_era = "2025"
                    break
                log.info("MCP connection %s/%s: listen ended: %s", *self.key, self._describe(error))
                lost = isinstance(error, SubscriptionLost) or error.code == types.INTERNAL_ERROR
                if not started or not lost:
                    break
            # A stream that ended while the session lives is re-opened; changes meanwhile
            # are caught by a re-list.
            self._changed.set()
            await anyio.sleep(self._timings.reconnect_min)
        if not started:
            task_status.started()

    async def _refresh_on_change(self) -> None:
        while True:
            await self._changed.wait()
            # Debounce: a burst of notifications becomes one listing.
            await anyio.sleep(self._timings.list_changed_debounce)
            self._changed = anyio.Event()
            try:
                await self.refresh("list_changed")
            except Exception as error:
                log.warning(
                    "MCP connection %s/%s: refresh after tools/list_changed failed: %s",
                    *self.key,
                    self._describe(error),
                )

    # Called from request handlers and the sweep.

    async def refresh(self, trigger: str) -> CatalogWrite:
        """`trigger` (connect, ttl, on_demand, list_changed) labels the refresh's metric."""
        client = self._client
        if client is None or self._status.state is not ConnectionState.CONNECTED:
            metrics.record_refresh(trigger, "failed")
            raise CatalogUnavailable(self._unreachable_text())
        return await self._refresh(client, trigger)

    async def _refresh(self, client: Client, trigger: str) -> CatalogWrite:
        try:
            write = await self._list_and_write(client)
        except BaseException:
            metrics.record_refresh(trigger, "failed")
            raise
        metrics.record_refresh(trigger, "changed" if write.changed else "unchanged")
        return write

    async def _list_and_write(self, client: Client) -> CatalogWrite:
        async with self._refresh_lock:
            refusals_before = self._refusals.count
            try:
                with anyio.fail_after(self._timings.connect_timeout):
                    listing = await list_all_tools(client, self.stored.connection.name)
            except Exception as error:
                if (mcp_error := _mcp_error(error)) and mcp_error.code == types.CONNECTION_CLOSED:
                    self._broken.set()
                detail = self._describe(error, refusals_before)
                raise CatalogUnavailable(f"listing tools failed: {detail}") from None
            write = await self._write_catalog(listing)
            if write is None:
                raise CatalogUnavailable("the connection was deleted")
            if listing.rejected and write.changed:
                self._warn_rejected(listing)
            self.last_refresh = anyio.current_time()
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
        shown = "; ".join(
            f"{self._scrub(item.name) or '(no name)'}: {self._scrub(item.reason)}"
            for item in listing.rejected[:_REJECTIONS_LOGGED]
        )
        more = len(listing.rejected) - _REJECTIONS_LOGGED
        log.warning(
            "MCP connection %s/%s: %s of its %d listed tools left out of the catalogue "
            "(invalid definitions): %s%s",
            *self.key,
            "all" if not listing.tools else str(len(listing.rejected)),
            len(listing.tools) + len(listing.rejected),
            shown,
            f"; and {more} more" if more > 0 else "",
        )

    async def call_tool(
        self, tool: str, arguments: Mapping[str, object], timeout_seconds: float
    ) -> McpToolResult:
        server = self.stored.connection.name
        started = time.perf_counter()
        outcome = "refused"
        with tracing.span("mcp.call_tool") as span:
            if span is not None:
                span.set_attributes({"mcp.server": server, "mcp.tool": tool})
            try:
                result, outcome = await self._call_tool(tool, arguments, timeout_seconds)
            except ToolCallFailed as error:
                outcome = error.outcome if isinstance(error, _CallFailed) else "refused"
                raise
            else:
                return result
            finally:
                metrics.record_tool_call(server, outcome, time.perf_counter() - started)
                if span is not None:
                    span.set_attribute("mcp.outcome", outcome)

    async def _call_tool(
        self, tool: str, arguments: Mapping[str, object], timeout_seconds: float
    ) -> tuple[McpToolResult, str]:
        """The result, and the call's metric outcome."""
        if self._status.state is ConnectionState.CONNECTING:
            await self.wait_attempt(
                self.finished_attempts, min(timeout_seconds, self._timings.connect_timeout)
            )
        client = self._client
        if client is None or self._status.state is not ConnectionState.CONNECTED:
            raise ToolCallFailed(self._unreachable_text())
        refusals_before = self._refusals.count
        try:
            return await self._call_connected(
                client, tool, arguments, timeout_seconds, refusals_before
            )
        except ToolCallFailed:
            if (reason := self._authorization_required()) is not None:
                # The server refused the tokens and they could not be renewed: the session
                # ends, and the state says why.
                self._set_authorization_required(reason)
                self._broken.set()
                raise _CallFailed(
                    authorization_line(self.stored.connection.name, reason), "refused"
                ) from None
            raise

    async def _call_connected(
        self,
        client: Client,
        tool: str,
        arguments: Mapping[str, object],
        timeout_seconds: float,
        refusals_before: int,
    ) -> tuple[McpToolResult, str]:
        try:
            # The SDK's read timeout answers first; the scope is a backstop.
            with anyio.fail_after(timeout_seconds + 5):
                result = await client.call_tool(
                    tool, dict(arguments), read_timeout_seconds=timeout_seconds
                )
            if self._judged_quickly(tool, result):
                return self._judged(tool, result)
            # Converting a large result (base64 decoding, JSON of tens of MB) and judging it
            # against its output schema are CPU work: off the event loop, so health checks
            # and other calls are answered meanwhile.
            judged = await anyio.to_thread.run_sync(self._judged, tool, result)
            release_large_result(result)
            return judged
        except Exception as error:
            if _expected(error):
                raise _CallFailed(
                    self._call_failure_text(tool, timeout_seconds, error, refusals_before),
                    _outcome(error),
                ) from None
            # A bug (here or in the SDK), not the server's failure: logged with its stack
            # under a correlation id; the model still gets a tool error naming that id.
            correlation_id = uuid.uuid4().hex
            log.exception(
                "unexpected error calling %r on MCP server %r, correlation id %s",
                tool,
                self.stored.connection.name,
                correlation_id,
                extra={"correlation_id": correlation_id},
            )
            raise _CallFailed(
                f"The call to {tool!r} on MCP server {self.stored.connection.name!r} failed "
                f"inside the sidecar ({type(error).__name__}); correlation id {correlation_id}.",
                "refused",
            ) from None

    def _judged_quickly(self, tool: str, result: types.CallToolResult) -> bool:
        """Whether converting and judging the result is cheap enough for the event loop: a
        small result, and no output schema check that is not (`SchemaValidators.quick`)."""
        if not small_result(result):
            return False
        schema = self._output_schemas.get(tool, b"")
        structured = result.structured_content
        return (
            not schema
            or structured is None
            or bool(result.is_error)
            or self._validators.quick(schema, structured)
        )

    def _judged(self, tool: str, result: types.CallToolResult) -> tuple[McpToolResult, str]:
        """The result as the log keeps it, and its metric outcome. One that breaks the tool's
        own output schema is the server's fault: a tool error the model can act on, with all
        the server sent after it, a warning (no traceback: nothing failed here) and the
        outcome server_error."""
        schema = self._output_schemas.get(tool, b"")
        problem = output_schema_problem(self._validators, schema, result)
        if not problem:
            return tool_result(result), "tool_error" if result.is_error else "ok"
        problem = self._scrub(problem)
        server = self.stored.connection.name
        log.warning(
            "MCP connection %s/%s: the result of %r does not match its declared output schema: %s",
            *self.key,
            tool,
            problem,
        )
        message = (
            f"MCP server {server!r} ran {tool!r}, but the server's result does not match its "
            f"declared output schema: {problem}. What the server returned follows."
        )
        return schema_broken_result(result, message), "server_error"

    def _unreachable_text(self) -> str:
        status = self._status
        server = self.stored.connection.name
        if status.authorization_reason is not None:
            return authorization_line(server, status.authorization_reason)
        if status.state is ConnectionState.CONNECTING:
            return f"MCP server {server!r} is still connecting; try again shortly."
        since = status.state_time.strftime("%Y-%m-%dT%H:%M:%SZ")
        reason = f": {status.last_error}" if status.last_error else ""
        return f"MCP server {server!r} is unreachable since {since}{reason}."

    def _call_failure_text(
        self, tool: str, timeout: float, error: BaseException, refusals_before: int
    ) -> str:
        server = self.stored.connection.name
        if refusal := self._refusal(error, refusals_before):
            return self._scrub(f"MCP server {server!r} refused the call to {tool!r}: {refusal}")
        mcp_error = _mcp_error(error)
        if isinstance(error, TimeoutError) or (
            mcp_error is not None and mcp_error.code == types.REQUEST_TIMEOUT
        ):
            return f"MCP server {server!r} did not answer {tool!r} within {timeout:g} seconds."
        if mcp_error is not None and mcp_error.code == types.CONNECTION_CLOSED:
            # Visible at once, not only when the owner has wound the session down.
            if self._status.state is ConnectionState.CONNECTED:
                self._set_status(ConnectionState.UNREACHABLE, "the connection closed")
            self._broken.set()
            return (
                f"The connection to MCP server {server!r} closed during the call to {tool!r}; "
                "the server is unreachable until it comes back."
            )
        if mcp_error is not None:
            return self._scrub(
                f"MCP server {server!r} answered the call to {tool!r} with error "
                f"{mcp_error.code}: {mcp_error.message}"
            )
        return f"The call to {tool!r} on MCP server {server!r} failed: {self._describe(error)}"


class _CallFailed(ToolCallFailed):
    """A call the server was asked and did not answer with a result."""

    def __init__(self, message: str, outcome: str) -> None:
        super().__init__(message)
        self.outcome = outcome


def _outcome(error: BaseException) -> str:
    """A failed call's metric outcome: timeout, refused (the connection closed),
    server_error (the answer was not a result) or tool_error (the server answered with an
    error)."""
    mcp_error = _mcp_error(error)
    if isinstance(error, TimeoutError) or (
        mcp_error is not None and mcp_error.code == types.REQUEST_TIMEOUT
    ):
        return "timeout"
    if mcp_error is not None and mcp_error.code == types.CONNECTION_CLOSED:
        return "refused"
    if mcp_error is None and isinstance(error, pydantic.ValidationError):
        return "server_error"  # not a CallToolResult at all
    return "tool_error"


def _leave_results_to_the_sidecar(client: Client) -> None:
    """Switch off the SDK's own check of a result against the tool's output schema. It raises
    RuntimeError for a result that breaks the schema, lacks structuredContent or whose schema
    has a remote `$ref` (a bug's path: "failed inside the sidecar", with a traceback), and
    re-lists the tools, whole, for a tool it has not seen listed. The sidecar judges results
    itself (`ConnectionSession._judged`), after the result is converted for the log."""

    async def judged_by_the_sidecar(name: str, result: types.CallToolResult) -> None:
        return None

    client.session.validate_tool_result = judged_by_the_sidecar  # type: ignore[method-assign]


async def _set_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _first_of(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as group:
        for event in events:
            group.start_soon(_set_when, event, group.cancel_scope)

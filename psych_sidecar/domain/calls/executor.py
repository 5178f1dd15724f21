"""Executing the tools the sidecar owns, and recording every result in the Run's log.

A call is checked against the Run's permitted set as of *now* (the current catalogue, the
connection's allow/deny, the Spec's grants, the Run's restrictions) whatever surface the model
saw, so a permission change or a removed tool takes effect on the next call. What a model can
get wrong — an unknown server, an unknown or unpermitted tool, malformed arguments, an
unreachable or timed-out server — comes back as a tool result with is_error set. Every
result, errors included, is appended to the log in full before the call returns.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import referencing
import referencing.exceptions

from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.canonical import bounded_loads, canonical_json, sorted_keys
from psych_sidecar.domain.catalog import CatalogTool, ToolCallFailed, ToolRunner
from psych_sidecar.domain.errors import Reason, SidecarError, field_required
from psych_sidecar.domain.runlog import (
    ContentPart,
    LogReader,
    PartKind,
    Record,
    RecordedCall,
    RecordKind,
    RunBlocking,
    RunService,
)
from psych_sidecar.domain.surface import (
    ExposedKind,
    ExposedTool,
    ResolvedTurn,
    RunContext,
    TurnResolver,
    naming,
    one_line,
    qualified_names,
)

T = TypeVar("T")

# How many schema violations a validation error lists.
MAX_VALIDATION_ERRORS = 5
SEARCH_RESULT_LIMIT = 10
SEARCH_DESCRIPTION_CHARS = 300
# What the model is told when its search was ranked before every tool was indexed (the host's
# SearchTools says the same with `partial`).
PARTIAL_RANKING_NOTE = (
    "Ranked while tool descriptions are still being indexed: some tools matched by keywords "
    "only. Searching again shortly may rank better."
)


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    is_error: bool
    result_json: bytes
    sequence: int
    handle: str


@dataclass(frozen=True, slots=True)
class PendingResult:
    """A result before it is recorded: what the log and the host get."""

    is_error: bool
    result_json: bytes
    content: tuple[ContentPart, ...]
    server: str
    tool: str


def tool_error(message: str, server: str = "", tool: str = "") -> PendingResult:
    result = {"content": [{"type": "text", "text": message}], "isError": True}
    return PendingResult(
        True, canonical_json(sorted_keys(result)), (ContentPart.text(message),), server, tool
    )


def _structured(value: Any, tool: str) -> PendingResult:
    """A result the sidecar produced itself: canonical JSON, as text and structured content."""
    text = canonical_json(sorted_keys(value)).decode()
    result = {
        "content": [{"type": "text", "text": text}],
        "isError": False,
        "structuredContent": value,
    }
    return PendingResult(
        False,
        canonical_json(sorted_keys(result)),
        (ContentPart(PartKind.JSON, text.encode()),),
        "",
        tool,
    )


# Schemas come from MCP servers (untrusted): a `$ref` resolves within the schema itself and the
# JSON Schema metaschemas, never over the network (jsonschema's default registry fetches
# remote `$ref`s, with no timeout). An empty registry: whatever else is unresolvable.
_NO_RETRIEVAL = referencing.Registry()


class _Validators:
    """JSON Schema validators per schema, built once: checking a schema costs more than using it."""

    def __init__(self) -> None:
        # (validator,) or (None,) for a schema that cannot be used.
        self._cache = ImmutableCache[bytes, tuple[Any]](4096)

    def errors(self, schema_json: bytes, arguments: Mapping[str, Any]) -> list[str] | None:
        """The violations, or None when the server's schema itself is unusable (then the
        server judges the arguments)."""
        cached = self._cache.get(schema_json)
        if cached is None:
            try:
                schema = json.loads(schema_json) if schema_json else {}
                cls = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
                cls.check_schema(schema)
                cached = (cls(schema, registry=_NO_RETRIEVAL),)
            except (ValueError, jsonschema.exceptions.SchemaError, TypeError):
                cached = (None,)
            self._cache.put(schema_json, cached)
        validator = cached[0]
        if validator is None:
            return None
        try:
            found = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        except referencing.exceptions.Unresolvable as error:
            ref = getattr(error, "ref", "")
            return [
                f"(schema): the input schema's $ref {ref[:200]!r} cannot be resolved (the "
                "sidecar resolves references within the schema only and never fetches one)"
            ]
        except jsonschema.exceptions.SchemaError:
            return None
        return [
            f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
            for error in found
        ]


KindHandler = Callable[
    [RunContext, ResolvedTurn, ExposedTool, Mapping[str, Any], float], Awaitable[PendingResult]
]
"""Runs one kind of exposed MCP tool (see `ToolExecutor.kind_handlers`)."""


class ToolExecutor:
    """Runs calls on MCP tools and the sidecar's own tools, and records their results."""

    def __init__(
        self,
        resolver: TurnResolver,
        runs: RunService,
        runner: ToolRunner,
        blocking: RunBlocking,
        default_timeout_seconds: float,
        log: LogReader | None = None,
        cpu: RunBlocking | None = None,
    ) -> None:
        self._resolver = resolver
        self._runs = runs
        self._log = log
        # CPU-heavy steps (search, schema validation) run here, never on the storage threads.
        self._cpu = cpu or blocking
        # Calls being executed, by (run, call id): a duplicate arriving meanwhile (a retry
        # after a lost response) waits for the first and gets its answer.
        self._in_flight: dict[tuple[str, str], asyncio.Task[ToolOutcome]] = {}
        self._runner = runner
        self._blocking = blocking
        self._default_timeout = default_timeout_seconds
        self._validators = _Validators()
        self._stale_routes = ImmutableCache[Hashable, dict[str, ExposedTool]](256)

    @property
    def default_timeout(self) -> float:
        return self._default_timeout

    def kind_handlers(self) -> dict[ExposedKind, KindHandler]:
        """How each kind of exposed MCP tool runs: the MCP half of the dispatch router
        (``DispatchService``), which adds the sidecar's own tools."""
        return {
            ExposedKind.MCP_TOOL: self._direct,
            ExposedKind.FACADE: self._facade,
            ExposedKind.CALL_DEFERRED_TOOL: self._call_deferred,
            ExposedKind.CALL_BY_NAME: self._call_by_name,
            ExposedKind.LIST_DEFERRED_TOOLS: self._list,
            ExposedKind.DESCRIBE_DEFERRED_TOOL: self._describe,
            ExposedKind.SEARCH: self._search,
        }

    # Entry points

    async def call_tool(
        self,
        run_id: str,
        server: str,
        tool: str,
        arguments: Mapping[str, Any],
        call_id: str,
        timeout_seconds: float | None,
    ) -> ToolOutcome:
        """CallDeferredTool: one MCP tool by (server, tool), narrowed like any other call."""
        if not call_id:
            raise field_required("call_id")
        if not server:
            raise field_required("server")
        if not tool:
            raise field_required("tool")
        context, resolved = await self._blocking(self._resolver.resolved, run_id)
        timeout = timeout_seconds or self._default_timeout

        async def run() -> PendingResult:
            return await self._call_mcp(resolved, server, tool, arguments, timeout)

        return await self.once(context, call_id, run)

    async def once(
        self, context: RunContext, call_id: str, run: Callable[[], Awaitable[PendingResult]]
    ) -> ToolOutcome:
        """Runs a call and records its result, once per (Run, assistant step, call id): a
        retry — after a lost response, concurrent or later — gets the recorded answer and
        the tool does not run again."""
        key = (context.run.run_id, call_id)
        task = self._in_flight.get(key)
        if task is None:
            # Not tied to this RPC: a call whose client gave up (a deadline) still finishes
            # and records its result, which the client's retry then finds.
            task = asyncio.ensure_future(self._run_once(context, call_id, run))
            self._in_flight[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        return await asyncio.shield(task)

    def _finished(self, key: tuple[str, str], task: asyncio.Task[ToolOutcome]) -> None:
        if self._in_flight.get(key) is task:
            del self._in_flight[key]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have gone

    async def _run_once(
        self, context: RunContext, call_id: str, run: Callable[[], Awaitable[PendingResult]]
    ) -> ToolOutcome:
        run_id = context.run.run_id
        request_id, recorded = await self._blocking(self._recorded, run_id, call_id)
        if recorded is not None:
            return _outcome(recorded)
        result = await run()
        try:
            return await self.record(context, call_id, result, request_id)
        except SidecarError as error:
            if error.reason is not Reason.REQUEST_ID_REUSED:
                raise
            # Another sidecar ran the same call meanwhile and recorded first: its answer
            # stands (this result is not recorded).
            _, recorded = await self._blocking(self._recorded, run_id, call_id)
            if recorded is None:
                raise
            return _outcome(recorded)

    def _recorded(self, run_id: str, call_id: str) -> tuple[str, RecordedCall | None]:
        """The request id naming this call in its assistant step, and its recorded result."""
        if self._log is None:
            return "", None
        step = self._log.latest_assistant_sequence(run_id)
        digest = hashlib.sha256(f"{step}\x00{call_id}".encode()).hexdigest()
        request_id = f"call-{digest[:48]}"
        return request_id, self._runs.recorded_call(run_id, request_id)

    def route(self, resolved: ResolvedTurn, name: str) -> ExposedTool | None:
        """The exposed tool a name stands for: on the current surface, or — for a name the
        model kept from an older surface — any tool or facade of the tenant's connections, so
        the call is refused through narrowing instead of being handed to the host."""
        route = resolved.routes.get(name)
        if route is not None:
            return route
        key = (resolved.snapshot.key, tuple(resolved.permitted))
        stale = self._stale_routes.get(key)
        if stale is None:
            stale = {}
            for known_server in resolved.permitted:
                known = resolved.snapshot.servers[known_server]
                facade = naming.facade_name(known_server)
                stale[facade] = ExposedTool(
                    facade, "", b"", ExposedKind.FACADE, server=known_server
                )
                for known_tool in known.tools:
                    exposed = naming.tool_name(known_server, known_tool.name)
                    stale[exposed] = ExposedTool(
                        exposed, "", b"", ExposedKind.MCP_TOOL, known_server, known_tool.name
                    )
            self._stale_routes.put(key, stale)
        route = stale.get(name)
        if route is not None:
            return route
        # A removed tool's clean name still says which server and tool it meant.
        server, separator, tool = name.partition("__")
        if separator and server in resolved.permitted and naming.tool_name(server, tool) == name:
            return ExposedTool(name, "", b"", ExposedKind.MCP_TOOL, server, tool)
        return None

    # Handlers, one per kind of exposed tool

    async def _direct(
        self,
        context: RunContext,
        resolved: ResolvedTurn,
        route: ExposedTool,
        arguments: Mapping[str, Any],
        timeout_seconds: float,
    ) -> PendingResult:
        return await self._call_mcp(resolved, route.server, route.tool, arguments, timeout_seconds)

    async def _facade(
        self,
        context: RunContext,
        resolved: ResolvedTurn,
        route: ExposedTool,
        arguments: Mapping[str, Any],
        timeout_seconds: float,
    ) -> PendingResult:
        tool = arguments.get("tool")
        if not isinstance(tool, str) or not tool:
            return tool_error(
                "Pass the tool's name as `tool` (a string) and its arguments as `input`."
            )
        return await self._call_mcp(
            resolved, route.server, tool, arguments.get("input", {}), timeout_seconds
        )

    async def _call_deferred(
        self,
        context: RunContext,
        resolved: ResolvedTurn,
        route: ExposedTool,
        arguments: Mapping[str, Any],
        timeout_seconds: float,
    ) -> PendingResult:
        server, tool = arguments.get("server"), arguments.get("tool")
        if not isinstance(server, str) or not isinstance(tool, str) or not server or not tool:
            return tool_error("Pass `server` and `tool` as strings, and the arguments as `input`.")
        return await self._call_mcp(
            resolved, server, tool, arguments.get("input", {}), timeout_seconds
        )

    async def _call_by_name(
        self,
        context: RunContext,
        resolved: ResolvedTurn,
        route: ExposedTool,
        arguments: Mapping[str, Any],
        timeout_seconds: float,
    ) -> PendingResult:
        name = arguments.get("name")
        if not isinstance(name, str) or not name:
            return tool_error(f"Pass a tool's name from {naming.SEARCH_TOOLS} as `name`.")
        target = qualified_names(resolved).get(name)
        if target is None and "/" in name:
            server, _, tool = name.partition("/")
            target = (server, tool)
        if target is None:
            return tool_error(
                f"There is no tool named {name!r} you may use; find one with {naming.SEARCH_TOOLS}."
            )
        return await self._call_mcp(resolved, *target, arguments.get("input", {}), timeout_seconds)

    async def _list(
        self,
        context: RunContext,
        resolved: ResolvedTurn,
        route: ExposedTool,
        arguments: Mapping[str, Any],
        timeout_seconds: float,
    ) -> PendingResult:
        server = arguments.get("server")
        tools = resolved.permitted.get(server) if isinstance(server, str) else None
        if tools is None:
            return _unknown_server(resolved, server)
        return _structured({"server": server, "tools": sorted(tools)}, route.name)

    async def _describe(
        self,
        context: RunContext,
        resolved: ResolvedTurn,
        route: ExposedTool,
        arguments: Mapping[str, Any],
        timeout_seconds: float,
    ) -> PendingResult:
        server, name = arguments.get("server"), arguments.get("tool")
        tools = resolved.permitted.get(server) if isinstance(server, str) else None
        if tools is None:
            return _unknown_server(resolved, server)
        tool = tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return _refused(str(server), name)
        return _structured(_description(str(server), tool), route.name)

    async def _search(
        self,
        context: RunContext,
        resolved: ResolvedTurn,
        route: ExposedTool,
        arguments: Mapping[str, Any],
        timeout_seconds: float,
    ) -> PendingResult:
        query, limit = arguments.get("query"), arguments.get("limit", SEARCH_RESULT_LIMIT)
        if not isinstance(query, str) or not query.strip():
            return tool_error("Pass the keywords, or a tool's exact name, as `query`.")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 50:
            return tool_error("`limit` must be an integer from 1 to 50.")
        hits, partial = await self._cpu(resolved.ranked_search, query, limit)
        found: dict[str, Any] = {
            "query": query,
            "results": [
                {
                    "name": naming.tool_name(hit.server, hit.tool.name),
                    "server": hit.server,
                    "tool": hit.tool.name,
                    "description": one_line(hit.tool.description, SEARCH_DESCRIPTION_CHARS),
                }
                for hit in hits
            ],
        }
        if partial:
            found["note"] = PARTIAL_RANKING_NOTE
        return _structured(found, route.name)

    # The one path to an MCP tool

    async def _call_mcp(
        self,
        resolved: ResolvedTurn,
        server: str,
        tool: str,
        arguments: Any,
        timeout_seconds: float,
    ) -> PendingResult:
        tools = resolved.permitted.get(server)
        if tools is None:
            return _unknown_server(resolved, server)
        found = tools.get(tool)
        if found is None:
            return _refused(server, tool)
        if not isinstance(arguments, dict):
            return tool_error(
                f"The arguments of {server}/{tool} must be a JSON object.", server, tool
            )
        problems = await self._cpu(self._validators.errors, found.input_schema_json, arguments)
        if problems:
            shown = problems[:MAX_VALIDATION_ERRORS]
            more = len(problems) - len(shown)
            message = (
                f"Invalid arguments for {server}/{tool}; nothing was run. "
                + "; ".join(shown)
                + (f"; and {more} more" if more else "")
                + f". Read its input schema with {naming.DESCRIBE_TOOL}."
            )
            return tool_error(message, server, tool)
        try:
            result = await self._runner.call_tool(
                resolved.snapshot.servers[server].connection.tenant,
                server,
                tool,
                arguments,
                timeout_seconds,
            )
        except ToolCallFailed as failure:
            return tool_error(f"{server}/{tool} did not answer: {failure}", server, tool)
        return PendingResult(result.is_error, result.result_json, result.content, server, tool)

    async def record(
        self, context: RunContext, call_id: str, result: PendingResult, request_id: str = ""
    ) -> ToolOutcome:
        record = Record(
            RecordKind.TOOL_RESULT,
            content=result.content,
            call_id=call_id,
            server=result.server,
            tool=result.tool,
            is_error=result.is_error,
        )
        (appended,) = await self._blocking(
            self._runs.append, context.run.run_id, request_id, (record,), result.result_json
        )
        return ToolOutcome(result.is_error, result.result_json, appended.sequence, appended.handle)


def fitted(outcome: ToolOutcome, max_bytes: int) -> ToolOutcome:
    """The outcome as a response carries it: whole when its result JSON fits in `max_bytes`,
    else an elided view — a text saying how large the result is and how to read it through
    its handle — with the handle. The log always keeps the whole result."""
    size = len(outcome.result_json)
    if size <= max_bytes:
        return outcome
    note = (
        f"[This tool result is {size} bytes of JSON, more than a tool-call response carries. It is "
        f"stored in full: read it in pages with read_tool_output (handle {outcome.handle}).]"
    )
    view = {
        "content": [{"type": "text", "text": note}],
        "isError": outcome.is_error,
        "_meta": {"psych.sidecar/elided": {"result_json_bytes": size, "handle": outcome.handle}},
    }
    return ToolOutcome(
        outcome.is_error, canonical_json(sorted_keys(view)), outcome.sequence, outcome.handle
    )


def _outcome(recorded: RecordedCall) -> ToolOutcome:
    return ToolOutcome(recorded.is_error, recorded.result_json, recorded.sequence, recorded.handle)


def parse_arguments(arguments_json: str) -> tuple[dict[str, Any] | None, str]:
    """The model's arguments as an object, or None and what is wrong with them."""
    if not arguments_json.strip():
        return {}, ""
    try:
        arguments = bounded_loads(arguments_json)
    except ValueError as error:
        return None, f"The arguments are not valid JSON ({error}); send a JSON object."
    if not isinstance(arguments, dict):
        return None, "The arguments must be a JSON object."
    return arguments, ""


def _unknown_server(resolved: ResolvedTurn, server: object) -> PendingResult:
    known = ", ".join(sorted(resolved.permitted)) or "none"
    return tool_error(f"There is no MCP server {server!r}. Servers: {known}.")


def _refused(server: str, tool: object) -> PendingResult:
    return tool_error(
        f"There is no tool {tool!r} on {server} that you may use. List the ones you may use "
        f"with {naming.LIST_TOOLS}.",
        server,
        tool if isinstance(tool, str) else "",
    )


def _description(server: str, tool: CatalogTool) -> dict[str, Any]:
    described: dict[str, Any] = {
        "server": server,
        "tool": tool.name,
        "description": tool.description,
        "input_schema": _json_or_empty(tool.input_schema_json),
    }
    if tool.output_schema_json:
        described["output_schema"] = _json_or_empty(tool.output_schema_json)
    if tool.annotations_json:
        described["annotations"] = _json_or_empty(tool.annotations_json)
    return described


def _json_or_empty(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {}

"""The one way a tool call runs: DispatchToolCall (a model's call, as emitted) and
CallDeferredTool (a host's call of one MCP tool by server and tool).

A model's call resolves to an exposed tool through the Run's current surface (`route`: the
surface's names, and names the model kept from an older one), and the tool's kind picks its
handler from one table: an MCP tool on the surface (`McpCalls`), the meta tools
(`MetaTools`), the sidecar's own tools (`OwnTools`). A name with no route belongs to the host.

Whatever runs, it runs once per (Run, assistant step, call id) and its result — errors
included, in full — is in the log before the call returns (`CallLedger`). What the model gets
wrong comes back as a tool result with is_error set; what the host gets wrong (a missing call
id, a handle this Run was never given) is a typed error and nothing is appended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any

from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.calls.arguments import ArgumentError, parse_arguments
from psych_sidecar.domain.calls.continuation import CallContinuation
from psych_sidecar.domain.calls.history import HistoryReader
from psych_sidecar.domain.calls.ledger import CallLedger
from psych_sidecar.domain.calls.limits import DEFAULT_MAX_ARGUMENT_BYTES
from psych_sidecar.domain.calls.mcp_calls import McpCalls, RoutedCall, TaskStart
from psych_sidecar.domain.calls.meta_tools import MetaTools
from psych_sidecar.domain.calls.outcomes import Asking, CallOutcome, CallResult, ToolResult
from psych_sidecar.domain.calls.own_tools import OwnTools
from psych_sidecar.domain.calls.references import (
    ReferenceProblem,
    ResultReferences,
    mentions_reference,
    with_resolved_references,
)
from psych_sidecar.domain.calls.task_types import CallExecution, ToolTask
from psych_sidecar.domain.calls.tasks import ToolTasks
from psych_sidecar.domain.calls.tool_output import ToolOutputReader
from psych_sidecar.domain.catalog import InputAnswer, InputWaits, McpToolRequest, ToolRunner
from psych_sidecar.domain.errors import field_invalid, field_required
from psych_sidecar.domain.runlog import (
    MAX_IDENTIFIER_LENGTH,
    LogReader,
    OffLoop,
    RunService,
    StorageNow,
    ToolCall,
)
from psych_sidecar.domain.surface import (
    ExposedKind,
    ExposedTool,
    ResolvedTurn,
    RunContext,
    TurnResolver,
    naming,
)

McpKindHandler = Callable[[RoutedCall], Awaitable[CallResult]]
"""Runs a kind of tool that takes any JSON object (an MCP tool, a facade, a meta tool)."""

OwnToolHandler = Callable[[RunContext, ToolCall], ToolResult]
"""Runs one of the sidecar's own tools, which check their arguments themselves."""

Handler = Callable[
    [RunContext, ResolvedTurn, ExposedTool, ToolCall, TaskStart | None], Awaitable[CallResult]
]


class ToolRouter:
    def __init__(
        self,
        *,
        resolver: TurnResolver,
        runs: RunService,
        log: LogReader,
        runner: ToolRunner,
        reader: ToolOutputReader,
        blocking: OffLoop,
        default_timeout_seconds: float,
        cpu: OffLoop | None = None,
        now: StorageNow | None = None,
        max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
        tasks: ToolTasks | None = None,
        waits: InputWaits | None = None,
        input_wait_seconds: float = 600.0,
    ) -> None:
        """`tasks`: how calls start as tasks on their servers (None: none does); `waits`:
        where calls waiting for their user's input are kept (None: a server's question ends
        its call as a tool error); `input_wait_seconds`: how long they wait."""
        self._resolver = resolver
        self._tasks = tasks
        self._blocking = blocking
        self._default_timeout = default_timeout_seconds
        # A call's reads before it runs (its turn, a recorded answer), and with a small
        # result its append, asked of the storage on the event loop's thread first (`now`).
        self._ledger = CallLedger(
            runs=runs,
            log=log,
            off_loop=blocking,
            now=now,
            waits=waits,
            input_wait_seconds=input_wait_seconds,
        )
        # CPU-heavy steps (search, schema validation) run there, never on the storage threads.
        self._mcp = McpCalls(runner, cpu or blocking)
        self._continuation = CallContinuation(
            resolver=resolver,
            ledger=self._ledger,
            mcp=self._mcp,
            blocking=blocking,
            default_timeout_seconds=default_timeout_seconds,
            tasks=tasks,
        )
        meta = MetaTools(self._mcp, cpu or blocking)
        own = OwnTools(reader, HistoryReader(log))
        # A model's call may name stored results as arguments: resolved on the storage threads.
        self._references = ResultReferences(reader, log, max_argument_bytes)
        # The dispatch table: every kind of tool the sidecar runs, and who runs it.
        self._table: dict[ExposedKind, Handler] = {
            ExposedKind.MCP_TOOL: self._taking_an_object(self._mcp.direct),
            ExposedKind.FACADE: self._taking_an_object(meta.facade),
            ExposedKind.CALL_DEFERRED_TOOL: self._taking_an_object(meta.call_deferred),
            ExposedKind.CALL_BY_NAME: self._taking_an_object(meta.call_by_name),
            ExposedKind.LIST_DEFERRED_TOOLS: self._taking_an_object(meta.list_tools),
            ExposedKind.DESCRIBE_DEFERRED_TOOL: self._taking_an_object(meta.describe_tool),
            ExposedKind.SEARCH: self._taking_an_object(meta.search),
            ExposedKind.READ_TOOL_OUTPUT: self._on_storage_threads(own.read_tool_output),
            ExposedKind.LOAD_SKILL: self._on_storage_threads(own.load_skill),
            ExposedKind.READ_HISTORY: self._on_storage_threads(own.read_history),
        }
        self._stale_routes = ImmutableCache[Hashable, dict[str, ExposedTool]](256)

    async def dispatch(
        self,
        run_id: str,
        call: ToolCall,
        execution: CallExecution = CallExecution.AS_DECLARED,
    ) -> CallOutcome | None:
        """Run and record the call when the sidecar owns its tool; None when the host does.
        `execution`: whether a call reaching an MCP tool may start as a task."""
        if not call.call_id:
            raise field_required("call.call_id")
        if not call.name:
            raise field_required("call.name")
        if "\x00" in call.call_id or len(call.call_id) > MAX_IDENTIFIER_LENGTH:
            raise field_invalid(
                "call.call_id", f"at most {MAX_IDENTIFIER_LENGTH} characters, no NUL"
            )
        found = self._resolver.resolved_now(run_id)
        if found is None:
            found = await self._blocking(self._resolver.resolved, run_id)
        context, resolved = found
        route = self.route(resolved, call.name)
        if route is None:
            return None
        handler = self._table[route.kind]

        start = self._task_start(run_id, call.call_id, execution)

        async def run() -> CallResult:
            result = await handler(context, resolved, route, call, start)
            if isinstance(result, Asking):
                return result
            if not result.server and not result.tool:
                # A result not tied to one MCP tool is recorded under the tool the model
                # called.
                result = dataclasses.replace(result, server=route.server, tool=route.name)
            return result

        return await self._ledger.once(context, call.call_id, run)

    async def call_tool(
        self,
        run_id: str,
        server: str,
        tool: str,
        arguments: Mapping[str, Any],
        call_id: str,
        timeout_seconds: float | None,
        execution: CallExecution = CallExecution.AS_DECLARED,
    ) -> CallOutcome:
        """CallDeferredTool: one MCP tool by (server, tool), narrowed like any other call;
        `execution` says whether it may start as a task."""
        if not call_id:
            raise field_required("call_id")
        if not server:
            raise field_required("server")
        if not tool:
            raise field_required("tool")
        timeout = timeout_seconds or self._default_timeout

        start = self._task_start(run_id, call_id, execution)

        async def run(turn: tuple[RunContext, ResolvedTurn]) -> CallResult:
            return await self._mcp.call(turn[1], server, tool, arguments, timeout, start=start)

        # The Run's turn is resolved in the same hop to the storage threads as the look-up
        # of a recorded answer (an unknown Run fails there, before anything runs).
        return await self._ledger.prepared_once(
            run_id,
            call_id,
            lambda: self._resolver.resolved_now(run_id),
            lambda: self._resolver.resolved(run_id),
            run,
        )

    def _task_start(self, run_id: str, call_id: str, execution: CallExecution) -> TaskStart | None:
        """How this call may start as a task (None: tasks are off here)."""
        tasks = self._tasks
        if tasks is None:
            return None

        async def start(request: McpToolRequest, timeout_seconds: float) -> Any:
            return await tasks.start(
                run_id=run_id,
                call_id=call_id,
                request=request,
                timeout_seconds=timeout_seconds,
                execution=execution,
            )

        return start

    async def continue_call(
        self,
        run_id: str,
        call_id: str,
        attempt: str,
        answers: tuple[InputAnswer, ...],
        timeout_seconds: float | None,
    ) -> CallOutcome | ToolTask:
        """ContinueToolCall: a call waiting for input, continued with its user's answers (a
        running task's questions: the task, running on)."""
        return await self._continuation.continue_call(
            run_id, call_id, attempt, answers, timeout_seconds
        )

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

    def _taking_an_object(self, handler: McpKindHandler) -> Handler:
        """An MCP or meta tool: its arguments are any JSON object (an MCP tool's input schema
        judges them further)."""

        async def run(
            context: RunContext,
            resolved: ResolvedTurn,
            route: ExposedTool,
            call: ToolCall,
            start: TaskStart | None,
        ) -> CallResult:
            try:
                arguments = parse_arguments(call.arguments_json)
            except ArgumentError as error:
                problem = str(error)
                return ToolResult.error(
                    f"{problem[:1].upper()}{problem[1:]}.", route.server, route.tool or route.name
                )
            if context.spec.disclosure.result_references is False or not mentions_reference(
                call.arguments_json
            ):
                return await handler(
                    RoutedCall(resolved, route, arguments, self._default_timeout, start)
                )
            # A handle of another Run raises INVALID_DEFERRED_HANDLE: nothing runs or is
            # recorded.
            found = await self._blocking(self._references.resolve, context.run, arguments)
            if isinstance(found, ReferenceProblem):
                return ToolResult.error(str(found), route.server, route.tool or route.name)
            routed = RoutedCall(resolved, route, found.arguments, self._default_timeout, start)
            return with_resolved_references(await handler(routed), found.references)

        return run

    def _on_storage_threads(self, handler: OwnToolHandler) -> Handler:
        """One of the sidecar's own tools: it reads the log, so it runs off the event loop
        (it needs the Run's context and the call only)."""
        return lambda context, resolved, route, call, start: self._blocking(handler, context, call)

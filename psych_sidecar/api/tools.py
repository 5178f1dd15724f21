"""ToolService: MCP tool calls, discovery and search (CallDeferredTool, ListServerTools,
DescribeTool, SearchTools), reads of stored results (ReadToolOutput), and DispatchToolCall,
which routes a model's call to the sidecar's own tools (read_tool_output, load_skill,
read_history), then to the Run's MCP surface, and otherwise answers
DISPATCH_DISPOSITION_HOST_TOOL. A call whose server asks for input first answers InputRequired;
ContinueToolCall continues it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

from psych.sidecar.v1 import tool_service_pb2, tool_service_pb2_grpc
from psych_sidecar.api import convert, tool_tasks
from psych_sidecar.api.connections import AUTHORIZATION_REASONS, catalog_tool_to_proto
from psych_sidecar.api.convert import RESPONSE_HEADROOM_BYTES
from psych_sidecar.api.plumbing import Blocking, Context, Serialized
from psych_sidecar.bulk import heap
from psych_sidecar.bulk.protobuf_splice import with_nested_bytes
from psych_sidecar.domain import calls
from psych_sidecar.domain.calls import (
    MAX_RESULT_BYTES_SERIALIZED_ON_LOOP,
    CallOutcome,
    ToolOutputReader,
    ToolRouter,
    ToolTasks,
    WaitingCall,
)
from psych_sidecar.domain.canonical import canonical_json, sorted_keys
from psych_sidecar.domain.catalog import InputAction, InputAnswer
from psych_sidecar.domain.errors import field_invalid, field_required
from psych_sidecar.domain.runlog import ToolCall
from psych_sidecar.domain.surface import READ_HISTORY, READ_TOOL_OUTPUT, TurnResolver
from psych_sidecar.telemetry import metrics

M = TypeVar("M", bound=Message)


def caller_gone(context: Context) -> Callable[[], bool]:
    """A check, safe from any thread, that turns true once the RPC is over (the client
    cancelled or went away) or its deadline has passed: long work polls it and stops."""
    done = threading.Event()
    # grpc-stubs declares the callback as a class, not a protocol: any callable works.
    context.add_done_callback(lambda _context: done.set())  # type: ignore[arg-type]
    remaining = context.time_remaining()
    deadline = None if remaining is None else time.monotonic() + remaining
    return lambda: done.is_set() or (deadline is not None and time.monotonic() > deadline)


def _integral_floats_as_ints(value: Any) -> Any:
    """google.protobuf.Struct holds every number as a double; a whole number is read back as
    an integer, as the JSON the host meant (5, not 5.0) and as "integer" schemas expect."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(item) for item in value]
    return value


def fitted(outcome: calls.ToolOutcome, max_bytes: int) -> calls.ToolOutcome:
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
    return calls.ToolOutcome(
        outcome.is_error,
        canonical_json(sorted_keys(view)),
        outcome.sequence,
        outcome.handle,
        outcome.authorization,
        outcome.task,
    )


def fill_outcome(
    target: tool_service_pb2.ToolOutcome, outcome: calls.ToolOutcome, max_bytes: int
) -> None:
    """The outcome into `target` (a response's field, filled in place: no copy of the
    message), elided when its result would not fit in a response (`fitted`)."""
    outcome = fitted(outcome, max_bytes)
    target.is_error = outcome.is_error
    target.result_json = outcome.result_json
    target.sequence = outcome.sequence
    target.handle = outcome.handle
    if outcome.authorization is not None:
        target.authorization_required_reason = AUTHORIZATION_REASONS[outcome.authorization]
    if outcome.task is not None:
        tool_tasks.fill_task(target.task, outcome.task)


_ACTIONS = {
    tool_service_pb2.INPUT_ACTION_ACCEPT: InputAction.ACCEPT,
    tool_service_pb2.INPUT_ACTION_DECLINE: InputAction.DECLINE,
    tool_service_pb2.INPUT_ACTION_CANCEL: InputAction.CANCEL,
}


def answers_from_proto(
    answers: Sequence[tool_service_pb2.InputAnswer],
) -> tuple[InputAnswer, ...]:
    found = []
    for index, answer in enumerate(answers):
        if not answer.key:
            raise field_required(f"answers[{index}].key")
        action = _ACTIONS.get(answer.action)
        if action is None:
            raise field_invalid(f"answers[{index}].action", "ACCEPT, DECLINE or CANCEL")
        content = None
        if answer.HasField("content"):
            if action is not InputAction.ACCEPT:
                raise field_invalid(f"answers[{index}].content", "only with ACCEPT")
            try:
                content = _integral_floats_as_ints(json_format.MessageToDict(answer.content))
            except ValueError as error:
                raise field_invalid(f"answers[{index}].content", str(error)) from None
        found.append(InputAnswer(answer.key, action, content))
    return tuple(found)


def _call_response(
    outcome: calls.ToolOutcome, max_bytes: int
) -> tool_service_pb2.CallDeferredToolResponse:
    response = tool_service_pb2.CallDeferredToolResponse()
    fill_outcome(response.outcome, outcome, max_bytes)
    return response


def _dispatch_response(
    outcome: calls.ToolOutcome, max_bytes: int
) -> tool_service_pb2.DispatchToolCallResponse:
    response = tool_service_pb2.DispatchToolCallResponse(
        disposition=tool_service_pb2.DISPATCH_DISPOSITION_EXECUTED
    )
    fill_outcome(response.outcome, outcome, max_bytes)
    return response


def _continue_response(
    outcome: calls.ToolOutcome, max_bytes: int
) -> tool_service_pb2.ContinueToolCallResponse:
    response = tool_service_pb2.ContinueToolCallResponse()
    fill_outcome(response.outcome, outcome, max_bytes)
    return response


def _call_waiting(waiting: WaitingCall) -> tool_service_pb2.CallDeferredToolResponse:
    response = tool_service_pb2.CallDeferredToolResponse()
    tool_tasks.fill_input_required(response.input_required, waiting)
    return response


def _dispatch_waiting(waiting: WaitingCall) -> tool_service_pb2.DispatchToolCallResponse:
    response = tool_service_pb2.DispatchToolCallResponse(
        disposition=tool_service_pb2.DISPATCH_DISPOSITION_INPUT_REQUIRED
    )
    tool_tasks.fill_input_required(response.input_required, waiting)
    return response


def _continue_waiting(waiting: WaitingCall) -> tool_service_pb2.ContinueToolCallResponse:
    response = tool_service_pb2.ContinueToolCallResponse()
    tool_tasks.fill_input_required(response.input_required, waiting)
    return response


# The field of the protobuf ToolOutcome a large result is spliced into (`serialized_with_result`).
_RESULT_JSON_FIELD = tool_service_pb2.ToolOutcome.DESCRIPTOR.fields_by_name["result_json"].number


def serialized_with_result(
    build: Callable[[calls.ToolOutcome, int], Message], outcome: calls.ToolOutcome, max_bytes: int
) -> Serialized:
    """The response `build` makes, serialized, with a large result's JSON spliced in at the
    wire level (`bulk.protobuf_splice`): the response is serialized without it, on a worker
    thread, and the result's one copy is a join that releases the GIL."""
    shown = fitted(outcome, max_bytes)
    if shown is not outcome:  # elided: small
        return Serialized(build(outcome, max_bytes).SerializeToString())
    head = build(replace(outcome, result_json=b""), max_bytes)
    return Serialized(
        with_nested_bytes(
            head.SerializeToString(),
            head.DESCRIPTOR.fields_by_name["outcome"].number,
            _RESULT_JSON_FIELD,
            outcome.result_json,
        )
    )


def _serialized_and_released(
    build: Callable[[calls.ToolOutcome, int], Message], outcome: calls.ToolOutcome, max_bytes: int
) -> Serialized:
    """`serialized_with_result`, then the free memory malloc kept while this result came in
    handed back (`heap.release_kept_memory`). Kept from one large result to the next, the
    blocks did not fit the next one's copies: four 50 MB results in a row took a sidecar's
    private memory from ~90 to ~430-480 MiB, a 50 MB step per result; released, each result
    starts again from the memory it needs."""
    serialized = serialized_with_result(build, outcome, max_bytes)
    heap.release_kept_memory()
    return serialized


class ToolServicer(tool_service_pb2_grpc.ToolServiceServicer):
    """A tool call's response with a large result is serialized off the event loop
    (`Serialized`), which the generated base's return types do not allow: those two
    overrides are exempt from mypy's check."""

    def __init__(
        self,
        *,
        resolver: TurnResolver,
        router: ToolRouter,
        reader: ToolOutputReader,
        blocking: Blocking,
        max_message_bytes: int,
        cpu: Blocking | None = None,
        grep_threads: int = 1,
        inline_result_bytes: int | None = None,
        tasks: ToolTasks | None = None,
    ) -> None:
        """`tasks`: calls that run as tasks (None: GetToolTask finds none)."""
        self._resolver = resolver
        self._tasks = tasks
        # Searching (which may build an index) is CPU work: its own threads, not storage's.
        self._cpu = cpu or blocking
        self._router = router
        self._reader = reader
        self._blocking = blocking
        self._page_bytes = max(max_message_bytes - RESPONSE_HEADROOM_BYTES, 1)
        # A tool-call response carries its result whole up to this size. gRPC's core copies
        # a response on the event loop's thread as it sends it, ~0.4 ms per MB here: a 50 MB
        # result held the loop ~20 ms, where its elided view costs nothing.
        self._inline_bytes = min(self._page_bytes, inline_result_bytes or self._page_bytes)
        # Greps (CPU-bound, up to the reader's budget each) may hold at most this many of
        # the storage threads, so that other RPCs always find one free.
        self._grep_slots = asyncio.Semaphore(max(1, grep_threads))

    async def CallDeferredTool(  # type: ignore[override]
        self, request: tool_service_pb2.CallDeferredToolRequest, context: Context
    ) -> tool_service_pb2.CallDeferredToolResponse | Serialized:
        if not request.run_id:
            raise field_required("run_id")
        timeout = None
        if request.HasField("timeout"):
            timeout = convert.timeout_from_proto(request.timeout, "timeout")
        try:
            arguments = json_format.MessageToDict(request.arguments)
        except ValueError as error:
            # NaN and infinities have no JSON form.
            raise field_invalid("arguments", str(error)) from None
        outcome = await self._router.call_tool(
            request.run_id,
            request.server,
            request.tool,
            _integral_floats_as_ints(arguments),
            request.call_id,
            timeout,
            tool_tasks.execution(request.execution),
        )
        return await self._respond(_call_response, _call_waiting, outcome)

    async def _respond(
        self,
        build: Callable[[calls.ToolOutcome, int], M],
        waiting: Callable[[WaitingCall], M],
        outcome: CallOutcome,
    ) -> M | Serialized:
        """The outcome's response (`build`), or the one saying the call waits (`waiting`)."""
        if isinstance(outcome, WaitingCall):
            return waiting(outcome)
        if len(outcome.result_json) <= MAX_RESULT_BYTES_SERIALIZED_ON_LOOP:
            return build(outcome, self._inline_bytes)
        return await self._cpu(_serialized_and_released, build, outcome, self._inline_bytes)

    async def ContinueToolCall(  # type: ignore[override]
        self, request: tool_service_pb2.ContinueToolCallRequest, context: Context
    ) -> tool_service_pb2.ContinueToolCallResponse | Serialized:
        timeout = None
        if request.HasField("timeout"):
            timeout = convert.timeout_from_proto(request.timeout, "timeout")
        outcome = await self._router.continue_call(
            request.run_id,
            request.call_id,
            request.attempt,
            answers_from_proto(request.answers),
            timeout,
        )
        if isinstance(outcome, calls.ToolTask):
            # A running task's questions were answered: the task, running on.
            response = tool_service_pb2.ContinueToolCallResponse()
            tool_tasks.fill_task(response.task, outcome)
            return response
        return await self._respond(_continue_response, _continue_waiting, outcome)

    async def ListServerTools(
        self, request: tool_service_pb2.ListServerToolsRequest, context: Context
    ) -> tool_service_pb2.ListServerToolsResponse:
        names, token = await self._blocking(
            self._resolver.list_server_tools,
            request.run_id,
            request.server,
            request.page_size,
            request.page_token,
        )
        return tool_service_pb2.ListServerToolsResponse(tool_names=names, next_page_token=token)

    async def DescribeTool(
        self, request: tool_service_pb2.DescribeToolRequest, context: Context
    ) -> tool_service_pb2.DescribeToolResponse:
        tool = await self._blocking(
            self._resolver.describe_tool, request.run_id, request.server, request.tool
        )
        return tool_service_pb2.DescribeToolResponse(tool=catalog_tool_to_proto(tool))

    async def SearchTools(
        self, request: tool_service_pb2.SearchToolsRequest, context: Context
    ) -> tool_service_pb2.SearchToolsResponse:
        with metrics.timed_search():
            # Searching (which may build an index) is CPU work: its own threads.
            hits, token, partial = await self._cpu(
                self._resolver.search_tools,
                request.run_id,
                request.query,
                request.page_size,
                request.page_token,
            )
        return tool_service_pb2.SearchToolsResponse(
            hits=[
                tool_service_pb2.SearchHit(
                    server=hit.server,
                    tool=hit.tool.name,
                    description=hit.tool.description,
                    score=hit.score,
                )
                for hit in hits
            ],
            next_page_token=token,
            partial=partial,
        )

    async def ReadToolOutput(
        self, request: tool_service_pb2.ReadToolOutputRequest, context: Context
    ) -> tool_service_pb2.ReadToolOutputResponse:
        read = partial(
            self._reader.read,
            request.run_id,
            request.handle,
            request.offset,
            request.limit,
            request.grep,
            self._page_bytes,
            caller_gone(context),
            query=request.query,
        )
        if request.grep or request.query:
            # A query is CPU work as a grep is: it takes one of the same slots.
            async with self._grep_slots:
                result = await self._blocking(read)
        else:
            result = await self._blocking(read)
        return tool_service_pb2.ReadToolOutputResponse(
            text=result.text,
            data=result.data,
            mime_type=result.mime_type,
            total_length=result.total_length,
            next_offset=result.next_offset,
            matches=[
                tool_service_pb2.GrepMatch(line_number=m.line_number, offset=m.offset, line=m.line)
                for m in result.matches
            ],
        )

    async def DispatchToolCall(  # type: ignore[override]
        self, request: tool_service_pb2.DispatchToolCallRequest, context: Context
    ) -> tool_service_pb2.DispatchToolCallResponse | Serialized:
        if not request.run_id:
            raise field_required("run_id")
        if not request.HasField("call"):
            raise field_required("call")
        call = ToolCall(request.call.call_id, request.call.name, request.call.arguments_json)
        execution = tool_tasks.execution(request.execution)
        if call.name in (READ_TOOL_OUTPUT, READ_HISTORY) and (
            '"grep"' in call.arguments_json or '"query"' in call.arguments_json
        ):
            # The model's grep or query (read_history's grep too) takes a grep slot like
            # ReadToolOutput's (a cheap, conservative test: a call that merely mentions
            # "grep" waits for a slot too).
            async with self._grep_slots:
                outcome = await self._router.dispatch(request.run_id, call, execution)
        else:
            outcome = await self._router.dispatch(request.run_id, call, execution)
        if outcome is None:
            return tool_service_pb2.DispatchToolCallResponse(
                disposition=tool_service_pb2.DISPATCH_DISPOSITION_HOST_TOOL
            )
        return await self._respond(_dispatch_response, _dispatch_waiting, outcome)

    async def GetToolTask(
        self, request: tool_service_pb2.GetToolTaskRequest, context: Context
    ) -> tool_service_pb2.GetToolTaskResponse:
        return await tool_tasks.get_tool_task(self._tasks, request)

    async def CancelToolTask(
        self, request: tool_service_pb2.CancelToolTaskRequest, context: Context
    ) -> tool_service_pb2.CancelToolTaskResponse:
        return await tool_tasks.cancel_tool_task(self._tasks, request)

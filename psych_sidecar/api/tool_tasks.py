"""ToolService's tasks: a call's ToolCallExecution in, its ToolTask out, and GetToolTask and
CancelToolTask (the host's polling and cancelling of a call that runs as a task)."""

from __future__ import annotations

from psych.sidecar.v1 import tool_service_pb2
from psych_sidecar.api import convert
from psych_sidecar.domain.calls import CallExecution, TaskState, ToolTask, ToolTasks, WaitingCall
from psych_sidecar.domain.catalog import InputMode
from psych_sidecar.domain.errors import field_invalid, field_required, tool_task_not_found

STATES = convert.by_proto_name(TaskState, tool_service_pb2.ToolTaskState, "TOOL_TASK_STATE_")


def execution(value: int) -> CallExecution:
    """A request's ToolCallExecution; an unknown value is FIELD_INVALID."""
    if value == tool_service_pb2.TOOL_CALL_EXECUTION_UNSPECIFIED:
        return CallExecution.AS_DECLARED
    if value == tool_service_pb2.TOOL_CALL_EXECUTION_LONG_RUNNING:
        return CallExecution.LONG_RUNNING
    raise field_invalid("execution", f"unknown ToolCallExecution {value}")


def fill_task(target: tool_service_pb2.ToolTask, task: ToolTask) -> None:
    target.run_id = task.run_id
    target.call_id = task.call_id
    target.server = task.server
    target.tool = task.tool
    target.task_id = task.task_id
    target.state = STATES[task.state]
    target.status_message = task.status_message
    target.create_time.CopyFrom(convert.timestamp(task.create_time))
    target.update_time.CopyFrom(convert.timestamp(task.update_time))
    target.result_call_id = task.result_call_id
    target.result_sequence = task.result_sequence
    target.result_handle = task.result_handle
    if task.waiting is not None:
        fill_input_required(target.input_required, WaitingCall.of(task.waiting))


_MODES = convert.by_proto_name(InputMode, tool_service_pb2.InputRequestMode, "INPUT_REQUEST_MODE_")


def fill_input_required(target: tool_service_pb2.InputRequired, waiting: WaitingCall) -> None:
    """A call's round of questions (a task's too) as the host gets it."""
    target.call_id = waiting.call_id
    target.attempt = waiting.attempt
    target.server = waiting.server
    target.tool = waiting.tool
    target.protocol_version = waiting.protocol_version
    target.expire_time.CopyFrom(convert.timestamp(waiting.expire_time))
    for request in waiting.requests:
        target.requests.add(
            key=request.key,
            mode=_MODES[request.mode],
            message=request.message,
            requested_schema_json=request.requested_schema_json,
            url=request.url,
            elicitation_id=request.elicitation_id,
            request_json=request.request_json,
        )


def _named(run_id: str, call_id: str) -> None:
    if not run_id:
        raise field_required("run_id")
    if not call_id:
        raise field_required("call_id")


async def get_tool_task(
    tasks: ToolTasks | None, request: tool_service_pb2.GetToolTaskRequest
) -> tool_service_pb2.GetToolTaskResponse:
    _named(request.run_id, request.call_id)
    if tasks is None:
        raise tool_task_not_found(request.run_id, request.call_id)
    response = tool_service_pb2.GetToolTaskResponse()
    fill_task(response.task, await tasks.get(request.run_id, request.call_id))
    return response


async def cancel_tool_task(
    tasks: ToolTasks | None, request: tool_service_pb2.CancelToolTaskRequest
) -> tool_service_pb2.CancelToolTaskResponse:
    _named(request.run_id, request.call_id)
    if tasks is None:
        raise tool_task_not_found(request.run_id, request.call_id)
    response = tool_service_pb2.CancelToolTaskResponse()
    fill_task(response.task, await tasks.cancel(request.run_id, request.call_id))
    return response

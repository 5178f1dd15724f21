"""Calls as tasks on one connection's live session (the MCP tasks extension,
`io.modelcontextprotocol/tasks`, 2026-07-28): the offer on a `tools/call`, `tasks/get`,
`tasks/update` (a task's own questions answered) and `tasks/cancel`. The SDK (mcp 2.3) has the
extension machinery but not this extension, so the requests are the session's own (its
stamping: `_meta`, `Mcp-Method`), sent raw, with the extension declared in that request's
client capabilities only: a server must not start a task for a request that did not declare
it, so every other call stays as it was.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.dispatcher import CallOptions
from mcp.shared.inbound import encode_header_value
from mcp_types import methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from psych_sidecar.domain.calls import StartedTask, TaskReport, TaskState
from psych_sidecar.mcp.input_rounds import Unanswerable, asked_of

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
_CAPABILITIES_KEY = types.CLIENT_CAPABILITIES_META_KEY
_STATES = {
    "working": TaskState.WORKING,
    "input_required": TaskState.INPUT_REQUIRED,
    "completed": TaskState.COMPLETED,
    "failed": TaskState.FAILED,
    "cancelled": TaskState.CANCELLED,
}
# A server's status message is kept up to this many characters.
MAX_STATUS_MESSAGE_CHARS = 1000


class NotATask(Exception):
    """A server's answer about a task that is not one (the message says why)."""


def supports_tasks(client: Client) -> bool:
    """Whether the server declared the extension (2026-07-28 sessions only)."""
    if client.session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = client.session.server_capabilities
    return capabilities is not None and TASKS_EXTENSION in (capabilities.extensions or {})


def long_running(tool: types.Tool) -> bool:
    """Whether a listed tool declares itself long-running (`execution.taskSupport`)."""
    execution = tool.execution
    return execution is not None and execution.task_support in ("optional", "required")


async def _send(
    client: Client, method: str, params: dict[str, Any], timeout_seconds: float, name: str = ""
) -> Any:
    """One request of the session, stamped as its own are, declaring the extension."""
    session = client.session
    data: dict[str, Any] = {"method": method, "params": params}
    options: CallOptions = {}
    session._stamp(data, options)
    meta = data["params"].get("_meta")
    if isinstance(meta, dict) and isinstance(meta.get(_CAPABILITIES_KEY), dict):
        # The stamp's capabilities are shared by every request: this one's is a copy.
        capabilities = copy.deepcopy(meta[_CAPABILITIES_KEY])
        capabilities.setdefault("extensions", {})[TASKS_EXTENSION] = {}
        meta[_CAPABILITIES_KEY] = capabilities
    if name:
        # tasks/* carry the task id as Mcp-Name (the extension's routing header).
        options.setdefault("headers", {})["mcp-name"] = encode_header_value(name)
    options["timeout"] = timeout_seconds
    with anyio.fail_after(timeout_seconds + 5):
        return await session._dispatcher.send_raw_request(method, data["params"], options)


async def call_offering_a_task(
    client: Client, tool: str, arguments: Mapping[str, object], timeout_seconds: float
) -> types.CallToolResult | types.InputRequiredResult | StartedTask:
    """tools/call with the extension declared: the result, the task the server started, or
    the questions it asks first (2026-07-28 input_required, answered as any call's)."""
    raw = await _send(
        client, "tools/call", {"name": tool, "arguments": dict(arguments)}, timeout_seconds, tool
    )
    if isinstance(raw, dict) and raw.get("resultType") == "input_required":
        return types.InputRequiredResult.model_validate(raw, by_name=False)
    if isinstance(raw, dict) and raw.get("resultType") == "task":
        report = _report(raw)
        task_id = raw.get("taskId")
        if not isinstance(task_id, str) or not task_id:
            raise NotATask("the server answered with a task without a taskId")
        return StartedTask(
            task_id=task_id,
            state=report.state,
            status_message=report.status_message,
            poll_interval_seconds=report.poll_interval_seconds,
        )
    version = client.session.protocol_version or "2025-11-25"
    with contextlib.suppress(KeyError, ValueError):
        # The revision's own rules for a result (a pydantic ValidationError is a ValueError:
        # judged below, as the SDK's own call would).
        methods.validate_server_result("tools/call", version, raw)
    return types.CallToolResult.model_validate(raw, by_name=False)


async def get_task(
    client: Client, task_id: str, timeout_seconds: float
) -> tuple[TaskReport, types.CallToolResult | None]:
    """Where the task is, and its result once completed (converted by the caller)."""
    raw = await _send(client, "tasks/get", {"taskId": task_id}, timeout_seconds, task_id)
    report = _report(raw)
    if report.state is TaskState.COMPLETED:
        result = raw.get("result")
        if not isinstance(result, dict):
            raise NotATask("a completed task without a result object")
        return report, types.CallToolResult.model_validate(result, by_name=False)
    if report.state is TaskState.FAILED:
        error = raw.get("error")
        detail = (
            f"error {error.get('code')}: {error.get('message')}"
            if isinstance(error, dict)
            else report.status_message or "the server gave no error"
        )
        return replace(report, detail=detail[:1000]), None
    if report.state is TaskState.INPUT_REQUIRED and raw.get("inputRequests"):
        # Its own questions, as an input_required result's (bounded, elicitations only).
        version = client.session.protocol_version or ""
        try:
            asked = types.InputRequiredResult.model_validate(
                {"inputRequests": raw["inputRequests"]}, by_name=False
            )
            return replace(report, asked=asked_of(asked, version)), None
        except (Unanswerable, ValueError) as error:
            detail = f"it asked for input this client cannot give: {str(error)[:300]}"
            return replace(report, state=TaskState.FAILED, detail=detail), None
    return report, None


async def update_task(
    client: Client,
    task_id: str,
    responses: Mapping[str, types.InputResponse],
    timeout_seconds: float,
) -> None:
    """tasks/update: answers to the task's input requests, by their keys (acked empty; the
    task's state is the next tasks/get's)."""
    params = {
        "taskId": task_id,
        "inputResponses": {
            key: response.model_dump(by_alias=True, mode="json", exclude_none=True)
            for key, response in responses.items()
        },
    }
    await _send(client, "tasks/update", params, timeout_seconds, task_id)


async def cancel_task(client: Client, task_id: str, timeout_seconds: float) -> None:
    await _send(client, "tasks/cancel", {"taskId": task_id}, timeout_seconds, task_id)


def _report(raw: Any) -> TaskReport:
    if not isinstance(raw, dict):
        raise NotATask("the answer is not a JSON object")
    state = _STATES.get(raw.get("status"))  # type: ignore[arg-type]
    if state is None:
        raise NotATask(f"unknown task status {str(raw.get('status'))[:40]!r}")
    message = raw.get("statusMessage")
    interval = raw.get("pollIntervalMs")
    seconds = (
        interval / 1000
        if isinstance(interval, int | float) and not isinstance(interval, bool) and interval > 0
        else None
    )
    return TaskReport(
        state=state,
        status_message=message[:MAX_STATUS_MESSAGE_CHARS] if isinstance(message, str) else "",
        poll_interval_seconds=seconds,
    )

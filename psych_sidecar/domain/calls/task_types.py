"""The values of tool calls that run as tasks (see `tasks.py`), apart so that a call's result
(`outcomes.py`) can carry its task."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from psych_sidecar.domain.catalog import InputAsked, InputWait, McpToolResult


class TaskState(StrEnum):
    """Where a task is (the contract's ToolTaskState without its prefix)."""

    WORKING = "WORKING"
    INPUT_REQUIRED = "INPUT_REQUIRED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def ended(self) -> bool:
        return self in (TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELLED)


class CallExecution(StrEnum):
    """How a call of an MCP tool runs (the contract's ToolCallExecution)."""

    # As a task only when the tool declares itself long-running.
    AS_DECLARED = "AS_DECLARED"
    # As a task wherever the server supports tasks.
    LONG_RUNNING = "LONG_RUNNING"


@dataclass(frozen=True, slots=True, kw_only=True)
class StartedTask:
    """A server's answer that the call runs as a task."""

    task_id: str
    state: TaskState
    status_message: str
    poll_interval_seconds: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskReport:
    """One poll's answer: where the task is, and when it ended, its result (COMPLETED) or why
    there is none (FAILED: `detail`)."""

    state: TaskState
    status_message: str
    poll_interval_seconds: float | None
    result: McpToolResult | None = None
    detail: str = ""
    # INPUT_REQUIRED: the server's input requests (the extension's `inputRequests`).
    asked: InputAsked | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolTask:
    """A call that runs as a task, as stored."""

    run_id: str
    call_id: str
    tenant: str
    server: str
    tool: str
    task_id: str
    state: TaskState
    status_message: str
    create_time: datetime
    update_time: datetime
    polls: int = 0
    poll_interval_seconds: float | None = None
    result_call_id: str = ""
    result_sequence: int = 0
    result_handle: str = ""
    # Its server's questions awaiting the host's answer (INPUT_REQUIRED only; not stored
    # with the task: the round is, see `task_input.py`).
    waiting: InputWait | None = None


def result_call_id(call_id: str) -> str:
    """The call id of the step a task's outcome is appended as; also the request id of that
    append and of the task's rounds of questions (so an answer's retry finds the outcome)."""
    return f"task-{hashlib.sha256(call_id.encode()).hexdigest()[:24]}"

"""Tool calls: running the tools the sidecar owns, and reading stored results.

:class:`ToolRouter` is the one way a call runs (a model's call as emitted, routed through the
resolved surface; a host's call of one MCP tool): membership re-checked at call time, once per
(Run, assistant step, call id), every result recorded in the log. :class:`ToolOutputReader`
reads stored results (``ReadToolOutput`` and ``read_tool_output``: handle, offset, limit,
grep, in-process over the log). :class:`SchemaValidators` compiles each tool schema's
validator once; the MCP layer judges results against output schemas with the same cache.
The limits on what a call's steps handle on the event loop's thread are in ``limits.py``.
:class:`ToolTasks` runs long calls as tasks on their MCP servers (``tasks.py``): stored,
polled by any sidecar on the database, their results appended to the log when they end.
"""

from __future__ import annotations

from psych_sidecar.domain.calls.limits import (
    MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP,
    MAX_RESULT_BYTES_APPENDED_ON_LOOP,
    MAX_RESULT_BYTES_SERIALIZED_ON_LOOP,
    MAX_RESULT_CHARS_CONVERTED_ON_LOOP,
)
from psych_sidecar.domain.calls.outcomes import CallOutcome, ToolOutcome, WaitingCall
from psych_sidecar.domain.calls.router import ToolRouter
from psych_sidecar.domain.calls.task_input import TaskQuestions
from psych_sidecar.domain.calls.task_types import (
    CallExecution,
    StartedTask,
    TaskReport,
    TaskState,
    ToolTask,
)
from psych_sidecar.domain.calls.tasks import (
    TASK_RESULT_TOOL,
    TaskRepository,
    TaskRunner,
    TaskTimings,
    ToolTasks,
)
from psych_sidecar.domain.calls.tool_output import GrepMatch, ReadResult, ToolOutputReader
from psych_sidecar.domain.calls.validation import SchemaValidators, json_within

__all__ = [
    "MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP",
    "MAX_RESULT_BYTES_APPENDED_ON_LOOP",
    "MAX_RESULT_BYTES_SERIALIZED_ON_LOOP",
    "MAX_RESULT_CHARS_CONVERTED_ON_LOOP",
    "TASK_RESULT_TOOL",
    "CallExecution",
    "CallOutcome",
    "GrepMatch",
    "ReadResult",
    "SchemaValidators",
    "StartedTask",
    "TaskQuestions",
    "TaskReport",
    "TaskRepository",
    "TaskRunner",
    "TaskState",
    "TaskTimings",
    "ToolOutcome",
    "ToolOutputReader",
    "ToolRouter",
    "ToolTask",
    "ToolTasks",
    "WaitingCall",
    "json_within",
]

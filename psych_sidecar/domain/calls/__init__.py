"""Tool calls: running the tools the sidecar owns, routing a model's call, reading results.

Owns :class:`ToolExecutor` (membership re-checked at call time, every result recorded in the
log), :class:`DispatchService` (a model's tool call as emitted, routed through the resolved
surface) and :class:`ToolOutputReader` (``read_tool_output``: handle, offset, limit, grep,
in-process over the log).
"""

from __future__ import annotations

from psych_sidecar.domain.calls.dispatch import DispatchService
from psych_sidecar.domain.calls.executor import ToolExecutor, ToolOutcome, fitted
from psych_sidecar.domain.calls.tool_output import GrepMatch, ReadResult, ToolOutputReader

__all__ = [
    "DispatchService",
    "GrepMatch",
    "ReadResult",
    "ToolExecutor",
    "ToolOutcome",
    "ToolOutputReader",
    "fitted",
]

"""The TaskRunner of domain/calls: calls that may run as tasks go to their connection's live
session (`task_calls.py` speaks the extension)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from psych_sidecar.domain.calls import CallExecution, StartedTask, TaskReport, TaskState
from psych_sidecar.domain.catalog import (
    ConnectionState,
    InputAnswer,
    InputAsked,
    McpToolRequest,
    McpToolResult,
    ToolCallFailed,
)
from psych_sidecar.mcp.registry import SessionPort

if TYPE_CHECKING:
    from mcp import Client

    from psych_sidecar.mcp.session import ConnectionSession

# The modules below import the MCP SDK: only once a call reaches a session (a sidecar with no
# MCP connection never imports the SDK, see session_types.py).


class SessionTaskRunner(SessionPort):
    """Implements TaskRunner over `sessions`. Runs on the server's event loop."""

    async def start_tool(
        self, request: McpToolRequest, timeout_seconds: float, execution: CallExecution
    ) -> McpToolResult | StartedTask | InputAsked:
        session = await self._session(request.tenant, request.server)
        tool, arguments = request.tool, request.arguments
        wanted = execution is CallExecution.LONG_RUNNING or session.catalog.long_running(tool)
        if wanted and session.state.status.state is ConnectionState.CONNECTING:
            # Whether the server supports tasks is known once it is connected.
            await session.state.wait_attempt(session.state.finished_attempts, timeout_seconds)
        client = session.state.client
        import mcp_types as types

        from psych_sidecar.mcp.task_calls import call_offering_a_task, supports_tasks

        if (
            not wanted
            or client is None
            or session.state.status.state is not ConnectionState.CONNECTED
            or not supports_tasks(client)
        ):
            # No task: the call as any other (its server may ask for input first).
            return await session.calls.call_tool(tool, arguments, timeout_seconds)
        try:
            answer = await call_offering_a_task(client, tool, arguments, timeout_seconds)
        except Exception as error:
            raise self._failed(session, f"the call to {tool!r}", error) from None
        if isinstance(answer, StartedTask):
            return answer
        if isinstance(answer, types.InputRequiredResult):
            # Not a task: the server asks first, and the call waits as any call would.
            return session.calls.asked(tool, answer, client.session.protocol_version or "")
        return session.calls.judge(tool, answer)

    async def poll_task(
        self, tenant: str, server: str, tool: str, task_id: str, timeout_seconds: float
    ) -> TaskReport:
        from psych_sidecar.mcp.task_calls import get_task

        session = await self._session(tenant, server)
        client = await self._connected(session, timeout_seconds)
        try:
            report, result = await get_task(client, task_id, timeout_seconds)
        except Exception as error:
            failure = self._failed(session, f"tasks/get of task {task_id!r}", error)
            if _forgotten(error):
                # The server does not know the task (expired, or lost with a restart): it
                # ended without a result.
                return TaskReport(
                    state=TaskState.FAILED,
                    status_message="",
                    poll_interval_seconds=None,
                    detail=f"the server no longer knows it: {failure}",
                )
            raise failure from None
        if result is None:
            return report
        converted = session.calls.judge(tool, result)
        return replace(report, result=converted)

    async def cancel_task(
        self, tenant: str, server: str, task_id: str, timeout_seconds: float
    ) -> None:
        from psych_sidecar.mcp.task_calls import cancel_task

        session = await self._session(tenant, server)
        client = await self._connected(session, timeout_seconds)
        try:
            await cancel_task(client, task_id, timeout_seconds)
        except Exception as error:
            raise self._failed(session, f"tasks/cancel of task {task_id!r}", error) from None

    async def answer_task(
        self,
        tenant: str,
        server: str,
        task_id: str,
        *,
        asked: InputAsked,
        answers: Sequence[InputAnswer],
        timeout_seconds: float,
    ) -> None:
        from psych_sidecar.mcp.input_rounds import input_responses
        from psych_sidecar.mcp.task_calls import update_task

        session = await self._session(tenant, server)
        client = await self._connected(session, timeout_seconds)
        try:
            await update_task(client, task_id, input_responses(asked, answers), timeout_seconds)
        except Exception as error:
            raise self._failed(session, f"tasks/update of task {task_id!r}", error) from None

    @staticmethod
    async def _connected(session: ConnectionSession, timeout_seconds: float) -> Client:
        """The session's client; a session still connecting (started by this request, on a
        sidecar that had not reached the server yet) is waited for, within the timeout."""
        state = session.state
        if state.status.state is ConnectionState.CONNECTING:
            await state.wait_attempt(state.finished_attempts, timeout_seconds)
        client = session.state.client
        if client is None or session.state.status.state is not ConnectionState.CONNECTED:
            raise ToolCallFailed(session.state.unreachable_text())
        return client

    @staticmethod
    def _failed(session: ConnectionSession, what: str, error: BaseException) -> ToolCallFailed:
        """The failure told to the model; a bug (here or in the SDK) is raised as it is."""
        from psych_sidecar.mcp.session_state import describe_error
        from psych_sidecar.mcp.task_calls import NotATask
        from psych_sidecar.mcp.tool_calls import expected_failure

        server = session.state.stored.connection.name
        if not expected_failure(error) and not isinstance(error, NotATask):
            raise error
        detail = session.state.scrub(describe_error(error))
        return ToolCallFailed(f"MCP server {server!r} did not answer {what}: {detail}")


def _forgotten(error: BaseException) -> bool:
    """tasks/get answered "no such task" (-32602, as the extension says for an unknown or
    expired task)."""
    import mcp_types as types

    from psych_sidecar.mcp.session_state import mcp_error

    failed = mcp_error(error)
    return failed is not None and failed.code == types.INVALID_PARAMS

"""The ToolRunner of domain/catalog: a tool call goes to its connection's live session."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from psych_sidecar.domain.catalog import (
    ConnectionState,
    InputAnswer,
    InputAsked,
    McpToolRequest,
    McpToolResult,
)
from psych_sidecar.mcp.registry import SessionPort
from psych_sidecar.telemetry import metrics


class SessionToolRunner(SessionPort):
    """Implements ToolRunner over `sessions`. Runs on the server's event loop."""

    def _no_such_server(self, server: str) -> None:
        # A call to a server that is not there is a refused tool call in the metrics.
        metrics.record_tool_call(server, "refused", 0.0)

    async def call_tool(
        self, request: McpToolRequest, timeout_seconds: float
    ) -> McpToolResult | InputAsked:
        session = await self._session(request.tenant, request.server)
        return await session.calls.call_tool(request.tool, request.arguments, timeout_seconds)

    async def continue_tool(
        self,
        request: McpToolRequest,
        *,
        asked: InputAsked,
        answers: Sequence[InputAnswer],
        timeout_seconds: float,
    ) -> McpToolResult | InputAsked:
        session = await self._session(request.tenant, request.server)
        return await session.calls.call_tool(
            request.tool, request.arguments, timeout_seconds, asked=asked, answers=answers
        )

    async def unreachable(self, tenant: str, server: str, timeout_seconds: float) -> str | None:
        """Why this sidecar's session to the server cannot reach it just now, after waiting
        for it within the timeout (across connect attempts: a session started by this
        request, or reconnecting); None once it is connected, or when what stops the call
        lasts (no such server, authorization needed), which the call itself reports."""
        session = await self._sessions.running_or_stored_session(tenant, server)
        if session is None:
            return None
        state = session.state
        transient = (ConnectionState.CONNECTING, ConnectionState.UNREACHABLE)
        with anyio.move_on_after(timeout_seconds):
            while state.status.state in transient and not state.stopping.is_set():
                finished = state.finished_attempts
                await state.wait_attempt(finished, timeout_seconds)
                if state.finished_attempts == finished:
                    break  # the owner task ended: no attempt follows
        if state.status.state in transient:
            return state.unreachable_text()
        return None

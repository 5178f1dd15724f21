"""ToolService.ReadToolOutput and DispatchToolCall: protobuf in, domain call, protobuf out."""

from __future__ import annotations

from psych.sidecar.v1 import tool_service_pb2
from psych_sidecar.api.servicers import Blocking, Context
from psych_sidecar.domain.dispatch import DispatchService
from psych_sidecar.domain.errors import field_required
from psych_sidecar.domain.runs import ToolCall
from psych_sidecar.domain.tool_output import ToolOutputReader

# What a read leaves of the message limit for the response's framing and its other fields.
_READ_HEADROOM_BYTES = 64 * 1024


class ToolOutputServicer:
    """ToolService.ReadToolOutput and DispatchToolCall. The MCP RPCs have no method here:
    the server answers them with NOT_IMPLEMENTED."""

    def __init__(
        self,
        reader: ToolOutputReader,
        dispatcher: DispatchService,
        blocking: Blocking,
        max_message_bytes: int,
    ) -> None:
        self._reader = reader
        self._dispatcher = dispatcher
        self._blocking = blocking
        self._page_bytes = max(max_message_bytes - _READ_HEADROOM_BYTES, 1)

    async def ReadToolOutput(
        self, request: tool_service_pb2.ReadToolOutputRequest, context: Context
    ) -> tool_service_pb2.ReadToolOutputResponse:
        result = await self._blocking(
            self._reader.read,
            request.run_id,
            request.handle,
            request.offset,
            request.limit,
            request.grep,
            self._page_bytes,
        )
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

    async def DispatchToolCall(
        self, request: tool_service_pb2.DispatchToolCallRequest, context: Context
    ) -> tool_service_pb2.DispatchToolCallResponse:
        if not request.HasField("call"):
            raise field_required("call")
        call = ToolCall(request.call.call_id, request.call.name, request.call.arguments_json)
        outcome = await self._blocking(self._dispatcher.dispatch, request.run_id, call)
        if outcome.execution is None:
            return tool_service_pb2.DispatchToolCallResponse(
                disposition=tool_service_pb2.DISPATCH_DISPOSITION_HOST_TOOL
            )
        return tool_service_pb2.DispatchToolCallResponse(
            disposition=tool_service_pb2.DISPATCH_DISPOSITION_EXECUTED,
            outcome=tool_service_pb2.ToolOutcome(
                is_error=outcome.execution.is_error,
                result_json=outcome.execution.result_json,
                sequence=outcome.sequence,
                handle=outcome.handle,
            ),
        )

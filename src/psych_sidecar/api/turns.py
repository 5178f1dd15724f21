"""TurnService.AssemblePrompt: protobuf in, assembly off the event loop, the prompt out."""

from __future__ import annotations

from datetime import UTC, datetime

from psych.sidecar.v1 import content_pb2, turn_pb2, turn_service_pb2
from psych_sidecar.api import convert
from psych_sidecar.api.servicers import Blocking, Context
from psych_sidecar.domain.assembly import AssembledPrompt, PromptAssembler
from psych_sidecar.domain.errors import Reason, SidecarError
from psych_sidecar.domain.prompt import Prompt, PromptMessage, Role, ToolResultView, Zone
from psych_sidecar.domain.runs import ContentPart, ToolCall
from psych_sidecar.domain.sidecar_tools import ExposedTool, ExposedToolKind

_ROLES = {Role.USER: turn_pb2.PROMPT_ROLE_USER, Role.ASSISTANT: turn_pb2.PROMPT_ROLE_ASSISTANT}
_ZONES = {
    Zone.STATIC_SYSTEM: turn_pb2.PROMPT_ZONE_STATIC_SYSTEM,
    Zone.DYNAMIC_TAIL: turn_pb2.PROMPT_ZONE_DYNAMIC_TAIL,
    Zone.HISTORY: turn_pb2.PROMPT_ZONE_HISTORY,
    Zone.TRANSIENT: turn_pb2.PROMPT_ZONE_TRANSIENT,
}
TOOL_KINDS = {
    ExposedToolKind.READ_TOOL_OUTPUT: turn_pb2.EXPOSED_TOOL_KIND_READ_TOOL_OUTPUT,
    ExposedToolKind.LOAD_SKILL: turn_pb2.EXPOSED_TOOL_KIND_LOAD_SKILL,
}


def exposed_tool_to_proto(tool: ExposedTool) -> turn_pb2.ExposedTool:
    return turn_pb2.ExposedTool(
        name=tool.name,
        description=tool.description,
        input_schema_json=tool.input_schema_json,
        kind=TOOL_KINDS[tool.kind],
    )


def _message_to_proto(message: PromptMessage) -> turn_pb2.PromptMessage:
    parts = []
    for part in message.parts:
        if isinstance(part, ContentPart):
            parts.append(turn_pb2.PromptPart(content=convert.content_to_proto((part,))[0]))
        elif isinstance(part, ToolCall):
            call = content_pb2.ToolCall(
                call_id=part.call_id, name=part.name, arguments_json=part.arguments_json
            )
            parts.append(turn_pb2.PromptPart(tool_call=call))
        else:
            parts.append(turn_pb2.PromptPart(tool_result=_result_to_proto(part)))
    return turn_pb2.PromptMessage(role=_ROLES[message.role], parts=parts)


def _result_to_proto(result: ToolResultView) -> turn_pb2.PromptToolResult:
    return turn_pb2.PromptToolResult(
        call_id=result.call_id,
        is_error=result.is_error,
        content=convert.content_to_proto(result.content),
        elided=result.elided,
        handle=result.handle,
    )


def prompt_to_proto(prompt: Prompt) -> turn_pb2.Prompt:
    return turn_pb2.Prompt(
        static_sections=[
            turn_pb2.SystemSection(title=s.title, text=s.text) for s in prompt.static_sections
        ],
        dynamic_tail=prompt.dynamic_tail,
        history=[_message_to_proto(m) for m in prompt.history],
        transient=_message_to_proto(prompt.transient),
        tools=turn_pb2.ToolSurface(tools=[exposed_tool_to_proto(t) for t in prompt.tools]),
    )


def assembled_to_proto(assembled: AssembledPrompt) -> turn_service_pb2.AssemblePromptResponse:
    return turn_service_pb2.AssemblePromptResponse(
        prompt=prompt_to_proto(assembled.prompt),
        zones=[
            turn_pb2.ZoneDigest(zone=_ZONES[d.zone], byte_length=d.byte_length, sha256=d.sha256)
            for d in assembled.zones
        ],
        anthropic_request_json=assembled.anthropic_json,
        openai_request_json=assembled.openai_json,
    )


class PromptServicer:
    """TurnService.AssemblePrompt. ResolveTurn has no method here: the server answers it
    with NOT_IMPLEMENTED."""

    def __init__(
        self, assembler: PromptAssembler, blocking: Blocking, max_message_bytes: int
    ) -> None:
        self._assembler = assembler
        self._blocking = blocking
        self._max_message_bytes = max_message_bytes

    async def AssemblePrompt(
        self, request: turn_service_pb2.AssemblePromptRequest, context: Context
    ) -> turn_service_pb2.AssemblePromptResponse:
        now = request.now.ToDatetime(tzinfo=UTC) if request.HasField("now") else datetime.now(UTC)
        assembled = await self._blocking(
            self._assembler.assemble,
            request.run_id,
            request.dynamic_tail,
            request.transient_note,
            now,
            request.model,
            request.max_tokens,
        )
        response = await self._blocking(assembled_to_proto, assembled)
        size = response.ByteSize()
        if size > self._max_message_bytes:
            # The current turn's results go in full; a prompt this large cannot be answered.
            raise SidecarError(
                Reason.MESSAGE_TOO_LARGE,
                f"the assembled prompt is {size} bytes, over the limit of "
                f"{self._max_message_bytes} bytes",
                limit_bytes=self._max_message_bytes,
                size_bytes=size,
            )
        return response

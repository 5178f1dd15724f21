"""TurnService: ResolveTurn (the Run's tool surface for this turn) and AssemblePrompt (the
exact prompt for one model call), protobuf in and out, domain work off the event loop."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from psych.sidecar.v1 import (
    connection_pb2,
    content_pb2,
    turn_pb2,
    turn_service_pb2,
    turn_service_pb2_grpc,
)
from psych_sidecar.api import convert
from psych_sidecar.api.plumbing import Blocking, Context, Serialized
from psych_sidecar.api.reasoning import reasoning_from_proto
from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.catalog import ConnectionState
from psych_sidecar.domain.errors import MessageTooLarge, field_invalid
from psych_sidecar.domain.estimate import estimate_tokens
from psych_sidecar.domain.prompt import (
    ALL_BODIES,
    AssembledPrompt,
    BodyFormat,
    CompactionProposal,
    GuardDecision,
    Prompt,
    PromptAssembler,
    PromptCall,
    PromptMessage,
    Role,
    ToolResultView,
    Zone,
)
from psych_sidecar.domain.runlog import ContentPart, ToolCall
from psych_sidecar.domain.surface import DisclosureTier, ExposedKind, ToolSurface, TurnResolver
from psych_sidecar.telemetry import metrics, tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

_ROLES = convert.by_proto_name(Role, turn_pb2.PromptRole, "PROMPT_ROLE_")
_ZONES = convert.by_proto_name(Zone, turn_pb2.PromptZone, "PROMPT_ZONE_")
TIERS = convert.by_proto_name(DisclosureTier, turn_pb2.DisclosureTier, "DISCLOSURE_TIER_")
KINDS = convert.by_proto_name(ExposedKind, turn_pb2.ExposedToolKind, "EXPOSED_TOOL_KIND_")
_BODIES = {
    turn_service_pb2.BODY_FORMAT_ANTHROPIC_MESSAGES: BodyFormat.ANTHROPIC_MESSAGES,
    turn_service_pb2.BODY_FORMAT_OPENAI_CHAT_COMPLETIONS: BodyFormat.OPENAI_CHAT_COMPLETIONS,
    turn_service_pb2.BODY_FORMAT_OPENAI_RESPONSES: BodyFormat.OPENAI_RESPONSES,
    turn_service_pb2.BODY_FORMAT_GEMINI_GENERATE_CONTENT: BodyFormat.GEMINI_GENERATE_CONTENT,
}
STATES = convert.by_proto_name(ConnectionState, connection_pb2.ConnectionState, "CONNECTION_STATE_")


def surface_to_proto(surface: ToolSurface) -> turn_pb2.ToolSurface:
    return turn_pb2.ToolSurface(
        tools=[
            turn_pb2.ExposedTool(
                name=tool.name,
                description=tool.description,
                input_schema_json=tool.input_schema_json,
                kind=KINDS[tool.kind],
                server=tool.server,
                tool=tool.tool,
            )
            for tool in surface.tools
        ],
        servers=[
            turn_pb2.ServerLine(
                server=line.server,
                tier=TIERS[line.tier],
                state=STATES[line.state],
                permitted_tool_count=line.permitted_tool_count,
                text=line.text,
            )
            for line in surface.servers
        ],
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
        tools=surface_to_proto(prompt.surface),
    )


def _proposal_to_proto(
    proposal: CompactionProposal | None,
) -> turn_service_pb2.CompactionProposal | None:
    if proposal is None:
        return None
    return turn_service_pb2.CompactionProposal(
        first_sequence=proposal.covered.first_sequence,
        last_sequence=proposal.covered.last_sequence,
        first_turn=proposal.first_turn,
        last_turn=proposal.last_turn,
        anthropic_request_json=proposal.anthropic_json,
        openai_request_json=proposal.openai_json,
        openai_responses_request_json=proposal.openai_responses_json,
        gemini_request_json=proposal.gemini_json,
        estimated_tokens=proposal.estimated_tokens,
        trigger_tokens=proposal.trigger_tokens,
        summary_max_tokens=proposal.summary_max_tokens,
        required=proposal.required,
        reason=proposal.reason,
    )


def assembled_to_proto(assembled: AssembledPrompt) -> turn_service_pb2.AssemblePromptResponse:
    if assembled.compaction is not None and assembled.compaction.required:
        # The call's own prompt would not fit: only the summary call can be made.
        return turn_service_pb2.AssemblePromptResponse(
            compaction=_proposal_to_proto(assembled.compaction),
            anthropic_betas=assembled.compaction.anthropic_betas,
        )
    return turn_service_pb2.AssemblePromptResponse(
        prompt=prompt_to_proto(assembled.prompt),
        zones=[
            turn_pb2.ZoneDigest(zone=_ZONES[d.zone], byte_length=d.byte_length, sha256=d.sha256)
            for d in assembled.zones
        ],
        anthropic_request_json=assembled.anthropic_json,
        openai_request_json=assembled.openai_json,
        openai_responses_request_json=assembled.openai_responses_json,
        gemini_request_json=assembled.gemini_json,
        context_guard=_guard_to_proto(assembled.guard),
        compaction=_proposal_to_proto(assembled.compaction),
        anthropic_betas=assembled.anthropic_betas,
    )


def bodies_from_proto(
    bodies: Sequence[turn_service_pb2.BodyFormat.ValueType],
) -> frozenset[BodyFormat]:
    """The request's `bodies`: all four when it names none."""
    for index, value in enumerate(bodies):
        if value not in _BODIES:
            raise field_invalid(
                f"bodies[{index}]", f"{value} is not a body format the sidecar builds"
            )
    return frozenset(_BODIES[value] for value in bodies) or ALL_BODIES


def _serialized_prompt(assembled: AssembledPrompt) -> Serialized:
    return Serialized(assembled_to_proto(assembled).SerializeToString())


def _guard_to_proto(guard: GuardDecision | None) -> turn_service_pb2.ContextGuard | None:
    if guard is None:
        return None
    return turn_service_pb2.ContextGuard(
        context_window_tokens=guard.context_window_tokens,
        output_reserve_tokens=guard.output_reserve_tokens,
        estimated_tokens=guard.estimated_tokens,
        full_estimated_tokens=guard.full_estimated_tokens,
        elided=[
            turn_service_pb2.GuardedResult(
                call_id=g.call_id,
                handle=g.handle,
                full_tokens=g.full_tokens,
                view_tokens=g.view_tokens,
            )
            for g in guard.elided
        ],
        reason=guard.reason,
    )


def _observe(assembled: AssembledPrompt, span: Span | None) -> None:
    """Zone sizes (never content) and elision savings, as metrics and span attributes."""
    zones = [
        (digest.zone.name.lower(), digest.byte_length, estimate_tokens(digest.byte_length))
        for digest in assembled.zones
    ]
    guarded = len(assembled.guard.elided) if assembled.guard is not None else 0
    metrics.record_prompt(
        zones,
        {
            "prior_turn": (
                assembled.elided_results - guarded - assembled.capped_results,
                assembled.elided_bytes_saved
                - assembled.guard_bytes_saved
                - assembled.cap_bytes_saved,
            ),
            "context_guard": (guarded, assembled.guard_bytes_saved),
            "current_turn_cap": (assembled.capped_results, assembled.cap_bytes_saved),
        },
    )
    if span is not None:
        for zone, size, tokens in zones:
            span.set_attribute(f"psych.prompt.{zone}.bytes", size)
            span.set_attribute(f"psych.prompt.{zone}.estimated_tokens", tokens)
        span.set_attribute("psych.prompt.elided_results", assembled.elided_results)
        span.set_attribute("psych.prompt.elided_bytes_saved", assembled.elided_bytes_saved)


class TurnServicer(turn_service_pb2_grpc.TurnServiceServicer):
    """Both RPCs answer with bytes serialized before or off the event loop (`Serialized`),
    which the generated base's return types do not allow: their overrides are exempt from
    mypy's check."""

    def __init__(
        self,
        *,
        resolver: TurnResolver,
        assembler: PromptAssembler,
        blocking: Blocking,
        max_message_bytes: int,
        cache_size: int = 1024,
    ) -> None:
        self._resolver = resolver
        self._assembler = assembler
        self._blocking = blocking
        self._max_message_bytes = max_message_bytes
        # A resolution returns the same surface object while nothing changed, so its response
        # is encoded once per surface. Entries hold their surface, so an id cannot be reused
        # while its entry lives.
        self._responses = ImmutableCache[int, tuple[ToolSurface, Serialized]](cache_size)

    async def ResolveTurn(  # type: ignore[override]
        self, request: turn_service_pb2.ResolveTurnRequest, context: Context
    ) -> Serialized:
        # A later step of a pinned turn is answered on the loop (TurnResolver.pinned_now);
        # the turn's first step, or one that would wait for the database, on a worker.
        surface = self._resolver.pinned_now(request.run_id)
        if surface is None:
            surface = await self._blocking(self._resolver.resolve_turn, request.run_id)
        cached = self._responses.get(id(surface))
        if cached is not None and cached[0] is surface:
            return cached[1]
        response = turn_service_pb2.ResolveTurnResponse(surface=surface_to_proto(surface))
        encoded = Serialized(response.SerializeToString())
        self._responses.put(id(surface), (surface, encoded))
        return encoded

    async def AssemblePrompt(  # type: ignore[override]
        self, request: turn_service_pb2.AssemblePromptRequest, context: Context
    ) -> Serialized:
        now = (
            convert.timestamp_from_proto(request.now, "now")
            if request.HasField("now")
            else datetime.now(UTC)
        )
        with tracing.span("prompt.assemble") as span:
            call = PromptCall(
                run_id=request.run_id,
                now=now,
                host_tail=request.dynamic_tail,
                transient_note=request.transient_note,
                model=request.model,
                max_tokens=request.max_tokens,
                budget_override=convert.context_budget_from_proto(request.context_budget)
                if request.HasField("context_budget")
                else None,
                reasoning_override=reasoning_from_proto(request.reasoning, "reasoning")
                if request.HasField("reasoning")
                else None,
                bodies=bodies_from_proto(request.bodies),
                compaction_override=convert.compaction_from_proto(request.compaction, "compaction")
                if request.HasField("compaction")
                else None,
            )
            assembled = await self._blocking(
                self._assembler.preview if request.preview else self._assembler.assemble, call
            )
            proposal = assembled.compaction
            if not request.preview and proposal is not None:
                metrics.record_compaction_proposed("required" if proposal.required else "due")
            if not request.preview and not (proposal is not None and proposal.required):
                _observe(assembled, span)
        # The response holds the prompt up to five times (parts and the bodies asked for): built
        # and encoded on a worker thread, which a prompt of MBs would otherwise cost the loop.
        response = await self._blocking(_serialized_prompt, assembled)
        size = len(response.data)
        if size > self._max_message_bytes:
            # The current turn's results go in full; a prompt this large cannot be answered.
            raise MessageTooLarge(
                f"the assembled prompt is {size} bytes, over the limit of "
                f"{self._max_message_bytes} bytes",
                limit_bytes=self._max_message_bytes,
                size_bytes=size,
            )
        return response

"""Protobuf messages to domain objects and back. No logic beyond the translation itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import Message

from psych.sidecar.v1 import content_pb2, run_pb2, spec_pb2
from psych_sidecar.api.reasoning import reasoning_from_proto, reasoning_to_proto
from psych_sidecar.domain.errors import field_invalid, field_required
from psych_sidecar.domain.runlog import (
    BlockEnvelope,
    CompactionBy,
    CompactionPolicy,
    CompactionRange,
    ContentPart,
    ContextBudget,
    DisclosureSettings,
    PartKind,
    ProgrammaticCalling,
    Provider,
    PublishedSpec,
    Record,
    RecordKind,
    Run,
    Skill,
    Spec,
    StoredRecord,
    Subagent,
    Thresholds,
    ToolCall,
    ToolCallers,
    ToolGrant,
    compaction_record,
    split_compaction,
)

if TYPE_CHECKING:
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

T = TypeVar("T")
M = TypeVar("M", bound=Message)
E = TypeVar("E", bound=Enum)
V = TypeVar("V", bound=int)

# A response (a page, a read) leaves this much of the message limit for framing and metadata.
RESPONSE_HEADROOM_BYTES = 64 * 1024

_THRESHOLD_FIELDS = (
    "per_result_tokens",
    "per_batch_tokens",
    "preview_head_chars",
    "preview_tail_chars",
    "failure_truncation_chars",
)
_DISCLOSURE_FIELDS = (
    "auto_preload_max_tools",
    "direct_max_tools",
    "facade_max_tools",
    "result_references",
)

RECORD_KINDS: dict[int, RecordKind] = {
    run_pb2.RECORD_KIND_USER_MESSAGE: RecordKind.USER_MESSAGE,
    run_pb2.RECORD_KIND_ASSISTANT_MESSAGE: RecordKind.ASSISTANT_MESSAGE,
    run_pb2.RECORD_KIND_TOOL_RESULT: RecordKind.TOOL_RESULT,
    run_pb2.RECORD_KIND_COMPACTION: RecordKind.COMPACTION,
}


def by_proto_name(members: Iterable[E], proto_enum: _EnumTypeWrapper[V], prefix: str) -> dict[E, V]:
    """Each member's value in a protobuf enum: the value named `prefix` + the member's name (a
    member the enum lacks fails at import)."""
    return {member: proto_enum.Value(prefix + member.name) for member in members}


def timestamp(value: datetime) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(value)
    return message


# google.protobuf.Timestamp's documented range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
_TIMESTAMP_MIN_SECONDS = -62_135_596_800
_TIMESTAMP_MAX_SECONDS = 253_402_300_799


def timestamp_from_proto(message: timestamp_pb2.Timestamp, field: str) -> datetime:
    """A host's Timestamp as an aware datetime; outside the Timestamp range, or with nanos
    outside [0, 999,999,999], it is FIELD_INVALID."""
    if not 0 <= message.nanos <= 999_999_999:
        raise field_invalid(field, f"nanos {message.nanos} is outside [0, 999999999]")
    if not _TIMESTAMP_MIN_SECONDS <= message.seconds <= _TIMESTAMP_MAX_SECONDS:
        raise field_invalid(
            field, f"seconds {message.seconds} is outside 0001-01-01 .. 9999-12-31 (UTC)"
        )
    return message.ToDatetime(tzinfo=UTC)


# google.protobuf.Duration's documented range is about ±10,000 years; a call timeout longer
# than a day is a mistake, not a wish.
MAX_TIMEOUT_SECONDS = 86_400


def timeout_from_proto(message: duration_pb2.Duration, field: str) -> float:
    """A host's timeout in seconds: positive, at most a day, nanos with the seconds' sign."""
    if not -999_999_999 <= message.nanos <= 999_999_999 or (message.seconds * message.nanos < 0):
        raise field_invalid(field, f"nanos {message.nanos} is not a valid Duration part")
    seconds = message.seconds + message.nanos / 1e9
    if not 0 < seconds <= MAX_TIMEOUT_SECONDS:
        raise field_invalid(field, f"must be positive and at most {MAX_TIMEOUT_SECONDS} s")
    return seconds


def grants_from_proto(grants: list[spec_pb2.ToolGrant]) -> tuple[ToolGrant, ...]:
    return tuple(ToolGrant(g.server_pattern, g.tool_pattern) for g in grants)


def grants_to_proto(grants: tuple[ToolGrant, ...]) -> list[spec_pb2.ToolGrant]:
    return [
        spec_pb2.ToolGrant(server_pattern=g.server_pattern, tool_pattern=g.tool_pattern)
        for g in grants
    ]


def _present(message: Message, names: tuple[str, ...]) -> dict[str, Any]:
    """The optional fields the sender set; unset ones take the domain's defaults."""
    return {name: getattr(message, name) for name in names if message.HasField(name)}


def _set_present(message: Message, settings: object, names: tuple[str, ...]) -> None:
    """`_present`'s way back: the settings' fields that are not None set on `message`, the
    others left unset."""
    for name in names:
        value = getattr(settings, name)
        if value is not None:
            setattr(message, name, value)


def _unless_default(to_proto: Callable[[T], M], settings: T) -> M | None:
    """The settings' message, or None (the field left unset) when they are their type's
    defaults."""
    return to_proto(settings) if settings != type(settings)() else None


def spec_from_proto(message: spec_pb2.Spec) -> Spec:
    thresholds = message.thresholds
    disclosure = message.disclosure
    return Spec(
        name=message.name,
        version=message.version,
        instructions=message.instructions,
        skills=tuple(Skill(s.name, s.description, s.body) for s in message.skills),
        subagents=tuple(Subagent(s.name, s.description) for s in message.subagents),
        capability_notes=tuple(message.capability_notes),
        thresholds=Thresholds(**_present(thresholds, _THRESHOLD_FIELDS)),
        disclosure=DisclosureSettings(**_present(disclosure, _DISCLOSURE_FIELDS)),
        grants=grants_from_proto(list(message.grants)),
        context_budget=context_budget_from_proto(message.context_budget),
        reasoning=reasoning_from_proto(message.reasoning, "spec.reasoning"),
        compaction=compaction_from_proto(message.compaction, "spec.compaction"),
        programmatic_calling=programmatic_from_proto(
            message.programmatic_calling, "spec.programmatic_calling"
        ),
    )


_CALLERS = {
    spec_pb2.TOOL_CALLERS_MODEL_AND_CODE: ToolCallers.MODEL_AND_CODE,
    spec_pb2.TOOL_CALLERS_CODE_ONLY: ToolCallers.CODE_ONLY,
}


def programmatic_from_proto(
    message: spec_pb2.ProgrammaticCalling, field_path: str
) -> ProgrammaticCalling:
    if message.callers and message.callers not in _CALLERS:
        raise field_invalid(f"{field_path}.callers", f"unknown value {message.callers}")
    return ProgrammaticCalling(
        callers=_CALLERS.get(message.callers),
        anthropic_code_execution_tool=message.anthropic_code_execution_tool,
    )


def programmatic_to_proto(settings: ProgrammaticCalling) -> spec_pb2.ProgrammaticCalling:
    callers = next((k for k, v in _CALLERS.items() if v == settings.callers), 0)
    return spec_pb2.ProgrammaticCalling(
        callers=callers,  # type: ignore[arg-type]
        anthropic_code_execution_tool=settings.anthropic_code_execution_tool,
    )


_COMPACTION_FIELDS = (
    "trigger_tokens",
    "trigger_fraction",
    "keep_recent_turns",
    "summary_instructions",
    "summary_max_tokens",
)


_COMPACTION_BY = {
    spec_pb2.COMPACTION_BY_HOST: CompactionBy.HOST,
    spec_pb2.COMPACTION_BY_PROVIDER: CompactionBy.PROVIDER,
}


def compaction_from_proto(message: spec_pb2.CompactionPolicy, field_path: str) -> CompactionPolicy:
    by = None
    if message.HasField("compaction_by"):
        by = _COMPACTION_BY.get(message.compaction_by)
        if by is None:
            raise field_invalid(
                f"{field_path}.compaction_by",
                "must be COMPACTION_BY_HOST or COMPACTION_BY_PROVIDER",
            )
    return CompactionPolicy(**_present(message, _COMPACTION_FIELDS), compaction_by=by)


def compaction_to_proto(policy: CompactionPolicy) -> spec_pb2.CompactionPolicy:
    message = spec_pb2.CompactionPolicy()
    _set_present(message, policy, _COMPACTION_FIELDS)
    if policy.compaction_by is not None:
        by = next(k for k, v in _COMPACTION_BY.items() if v is policy.compaction_by)
        message.compaction_by = by
    return message


_BUDGET_FIELDS = ("context_window_tokens", "output_reserve_tokens", "current_turn_result_tokens")


def context_budget_from_proto(message: spec_pb2.ContextBudget) -> ContextBudget:
    return ContextBudget(**_present(message, _BUDGET_FIELDS))


def context_budget_to_proto(budget: ContextBudget) -> spec_pb2.ContextBudget:
    message = spec_pb2.ContextBudget()
    _set_present(message, budget, _BUDGET_FIELDS)
    return message


def spec_to_proto(published: PublishedSpec) -> spec_pb2.Spec:
    spec = published.spec
    thresholds = spec_pb2.Thresholds()
    _set_present(thresholds, spec.thresholds, _THRESHOLD_FIELDS)
    disclosure = spec_pb2.DisclosureSettings()
    _set_present(disclosure, spec.disclosure, _DISCLOSURE_FIELDS)
    return spec_pb2.Spec(
        name=spec.name,
        version=spec.version,
        instructions=spec.instructions,
        skills=[
            spec_pb2.Skill(name=s.name, description=s.description, body=s.body) for s in spec.skills
        ],
        subagents=[
            spec_pb2.Subagent(name=s.name, description=s.description) for s in spec.subagents
        ],
        capability_notes=list(spec.capability_notes),
        thresholds=thresholds,
        disclosure=disclosure,
        grants=grants_to_proto(spec.grants),
        create_time=timestamp(published.create_time),
        context_budget=_unless_default(context_budget_to_proto, spec.context_budget),
        reasoning=_unless_default(reasoning_to_proto, spec.reasoning),
        programmatic_calling=_unless_default(programmatic_to_proto, spec.programmatic_calling),
        compaction=_unless_default(compaction_to_proto, spec.compaction),
    )


def run_to_proto(run: Run) -> run_pb2.Run:
    return run_pb2.Run(
        run_id=run.run_id,
        tenant=run.tenant,
        spec_name=run.spec_name,
        spec_version=run.spec_version,
        tool_restrictions=grants_to_proto(run.tool_restrictions),
        create_time=timestamp(run.create_time),
    )


def content_from_proto(
    parts: list[content_pb2.ContentPart], field_path: str
) -> tuple[ContentPart, ...]:
    result = []
    for index, part in enumerate(parts):
        kind = part.WhichOneof("kind")
        if kind == "text":
            result.append(ContentPart(PartKind.TEXT, part.text.encode()))
        elif kind == "json":
            result.append(ContentPart(PartKind.JSON, part.json))
        elif kind == "binary":
            result.append(ContentPart(PartKind.BINARY, part.binary.data, part.binary.mime_type))
        elif kind == "provider_block":
            result.append(_provider_block(part.provider_block, f"{field_path}[{index}]"))
        else:
            raise field_required(f"{field_path}[{index}].kind")
    return tuple(result)


_PROVIDERS_TO_PROTO = {
    Provider.ANTHROPIC: content_pb2.PROVIDER_ANTHROPIC,
    Provider.OPENAI: content_pb2.PROVIDER_OPENAI,
    Provider.GEMINI: content_pb2.PROVIDER_GEMINI,
}
_PROVIDERS_FROM_PROTO = {value: key for key, value in _PROVIDERS_TO_PROTO.items()}


def _provider_block(block: content_pb2.ProviderBlock, field_path: str) -> ContentPart:
    """The block's envelope checked here; its bytes by `validate_record`."""
    if block.provider == content_pb2.PROVIDER_UNSPECIFIED:
        raise field_required(f"{field_path}.provider_block.provider")
    provider = _PROVIDERS_FROM_PROTO.get(block.provider)
    if provider is None:
        raise field_invalid(f"{field_path}.provider_block.provider", "unknown provider")
    return ContentPart.provider_block(
        BlockEnvelope(provider, block.type, block.call_id), block.json
    )


def content_to_proto(parts: tuple[ContentPart, ...]) -> list[content_pb2.ContentPart]:
    result = []
    for part in parts:
        if part.kind is PartKind.TEXT:
            result.append(content_pb2.ContentPart(text=part.as_text()))
        elif part.kind is PartKind.JSON:
            result.append(content_pb2.ContentPart(json=part.data))
        elif part.kind is PartKind.PROVIDER_BLOCK:
            envelope = part.envelope
            block = content_pb2.ProviderBlock(
                provider=_PROVIDERS_TO_PROTO[envelope.provider],
                type=envelope.block_type,
                json=part.data,
                call_id=envelope.call_id,
            )
            result.append(content_pb2.ContentPart(provider_block=block))
        else:
            binary = content_pb2.BinaryContent(mime_type=part.mime_type, data=part.data)
            result.append(content_pb2.ContentPart(binary=binary))
    return result


def record_from_proto(message: run_pb2.Record, field_path: str) -> Record:
    kind = message.WhichOneof("kind")
    if kind == "user_message":
        return Record(
            RecordKind.USER_MESSAGE,
            content=content_from_proto(
                list(message.user_message.content), f"{field_path}.user_message.content"
            ),
        )
    if kind == "assistant_message":
        assistant = message.assistant_message
        return Record(
            RecordKind.ASSISTANT_MESSAGE,
            content=content_from_proto(
                list(assistant.content), f"{field_path}.assistant_message.content"
            ),
            tool_calls=tuple(
                ToolCall(c.call_id, c.name, c.arguments_json) for c in assistant.tool_calls
            ),
        )
    if kind == "tool_result":
        result = message.tool_result
        return Record(
            RecordKind.TOOL_RESULT,
            content=content_from_proto(list(result.content), f"{field_path}.tool_result.content"),
            call_id=result.call_id,
            server=result.server,
            tool=result.tool,
            is_error=result.is_error,
        )
    if kind == "compaction":
        compaction = message.compaction
        return compaction_record(
            content_from_proto(list(compaction.summary), f"{field_path}.compaction.summary"),
            CompactionRange(compaction.first_sequence, compaction.last_sequence),
        )
    raise field_required(f"{field_path}.kind")


def record_to_proto(stored: StoredRecord) -> run_pb2.Record:
    record = stored.record
    message = run_pb2.Record(
        run_id=stored.run_id,
        sequence=stored.sequence,
        create_time=timestamp(stored.create_time),
        handle=stored.handle,
    )
    content = content_to_proto(record.content) if record.kind is not RecordKind.COMPACTION else []
    if record.kind is RecordKind.USER_MESSAGE:
        message.user_message.content.extend(content)
    elif record.kind is RecordKind.ASSISTANT_MESSAGE:
        message.assistant_message.content.extend(content)
        message.assistant_message.tool_calls.extend(
            content_pb2.ToolCall(call_id=c.call_id, name=c.name, arguments_json=c.arguments_json)
            for c in record.tool_calls
        )
    elif record.kind is RecordKind.COMPACTION:
        summary, covered = split_compaction(record.content)
        message.compaction.summary.extend(content_to_proto(summary))
        message.compaction.first_sequence = covered.first_sequence
        message.compaction.last_sequence = covered.last_sequence
    else:
        result = message.tool_result
        result.call_id = record.call_id
        result.server = record.server
        result.tool = record.tool
        result.is_error = record.is_error
        result.content.extend(content)
    return message


def record_kinds_from_proto(values: list[int]) -> tuple[RecordKind, ...]:
    kinds = []
    for index, value in enumerate(values):
        kind = RECORD_KINDS.get(value)
        if kind is None:
            raise field_invalid(f"kinds[{index}]", f"{value} is not a record kind")
        kinds.append(kind)
    return tuple(kinds)

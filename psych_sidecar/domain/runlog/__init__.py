"""The Run log: Specs, Runs and their append-only Record log.

Owns publishing immutable Spec versions (thresholds checked at publish), creating Runs,
appending records with gap-free sequences and request-id idempotency, paging through the log
(opaque page tokens), and a stored tool result's text layout (planned from part sizes, so a
read or a preview loads only what it shows). Storage implements :class:`SpecRepository` and
:class:`RunRepository`.
"""

from __future__ import annotations

from psych_sidecar.domain.runlog.compaction import (
    COMPACTION_RANGE_MIME,
    CompactionRange,
    compaction_record,
    latest_compaction,
    split_compaction,
)
from psych_sidecar.domain.runlog.compaction_policy import (
    CompactionBy,
    CompactionPolicy,
    validate_compaction,
    validate_provider_trigger,
)
from psych_sidecar.domain.runlog.content import (
    SEPARATOR,
    ByteRange,
    PartMeta,
    Piece,
    RecordSkeleton,
    TextLayout,
    binary_marker,
    fetch_text,
)
from psych_sidecar.domain.runlog.deletion import (
    DeletedRun,
    DeletionCause,
    ExpiryHeld,
    ExpiryPass,
    RunDeletion,
    RunDeletionRepository,
    TenantSettingsDeleted,
)
from psych_sidecar.domain.runlog.paging import decode_token, encode_token, page_size
from psych_sidecar.domain.runlog.ports import (
    LogReader,
    OffLoop,
    PendingAppend,
    RunRepository,
    SpecRepository,
    StorageNow,
)
from psych_sidecar.domain.runlog.programmatic import ProgrammaticCalling, ToolCallers
from psych_sidecar.domain.runlog.provider_blocks import (
    MAX_PROVIDER_BLOCK_BYTES,
    BlockEnvelope,
    Provider,
)
from psych_sidecar.domain.runlog.reasoning import (
    AnthropicThinking,
    GeminiThinkingLevel,
    ReasoningEffort,
    ReasoningSettings,
    validate_call_reasoning,
)
from psych_sidecar.domain.runlog.result_outline import CallResultOutline
from psych_sidecar.domain.runlog.runs import (
    ALL_TENANTS,
    MAX_IDENTIFIER_LENGTH,
    STRUCTURED_CONTENT_MIME,
    AllTenants,
    AppendedRecord,
    ContentPart,
    ListedRun,
    PartKind,
    Record,
    RecordedCall,
    RecordKind,
    Run,
    StoredRecord,
    ToolCall,
    model_view,
    validate_request_id,
)
from psych_sidecar.domain.runlog.services import RunService, SpecLookup, SpecService, new_id
from psych_sidecar.domain.runlog.specs import (
    DEFAULT_CONTEXT_WINDOW_TOKENS,
    ContextBudget,
    DisclosureSettings,
    EffectiveThresholds,
    PublishedSpec,
    Skill,
    Spec,
    Subagent,
    Thresholds,
    ToolGrant,
    validate_context_budget,
    validate_name,
)

__all__ = [
    "ALL_TENANTS",
    "COMPACTION_RANGE_MIME",
    "DEFAULT_CONTEXT_WINDOW_TOKENS",
    "MAX_IDENTIFIER_LENGTH",
    "MAX_PROVIDER_BLOCK_BYTES",
    "SEPARATOR",
    "STRUCTURED_CONTENT_MIME",
    "AllTenants",
    "AnthropicThinking",
    "AppendedRecord",
    "BlockEnvelope",
    "ByteRange",
    "CallResultOutline",
    "CompactionBy",
    "CompactionPolicy",
    "CompactionRange",
    "ContentPart",
    "ContextBudget",
    "DeletedRun",
    "DeletionCause",
    "DisclosureSettings",
    "EffectiveThresholds",
    "ExpiryHeld",
    "ExpiryPass",
    "GeminiThinkingLevel",
    "ListedRun",
    "LogReader",
    "OffLoop",
    "PartKind",
    "PartMeta",
    "PendingAppend",
    "Piece",
    "ProgrammaticCalling",
    "Provider",
    "PublishedSpec",
    "ReasoningEffort",
    "ReasoningSettings",
    "Record",
    "RecordKind",
    "RecordSkeleton",
    "RecordedCall",
    "Run",
    "RunDeletion",
    "RunDeletionRepository",
    "RunRepository",
    "RunService",
    "Skill",
    "Spec",
    "SpecLookup",
    "SpecRepository",
    "SpecService",
    "StorageNow",
    "StoredRecord",
    "Subagent",
    "TenantSettingsDeleted",
    "TextLayout",
    "Thresholds",
    "ToolCall",
    "ToolCallers",
    "ToolGrant",
    "binary_marker",
    "compaction_record",
    "decode_token",
    "encode_token",
    "fetch_text",
    "latest_compaction",
    "model_view",
    "new_id",
    "page_size",
    "split_compaction",
    "validate_call_reasoning",
    "validate_compaction",
    "validate_context_budget",
    "validate_name",
    "validate_provider_trigger",
    "validate_request_id",
]

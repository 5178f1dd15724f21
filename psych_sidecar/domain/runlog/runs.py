"""Runs and their append-only Record log."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum, StrEnum
from typing import Final, Protocol, TypeVar

from psych_sidecar.bulk.slices import utf8_sliced
from psych_sidecar.domain.canonical import bounded_loads
from psych_sidecar.domain.errors import field_invalid, field_required
from psych_sidecar.domain.runlog.provider_blocks import MAX_PROVIDER_BLOCK_BYTES, BlockEnvelope
from psych_sidecar.domain.runlog.specs import ToolGrant

MAX_REQUEST_ID_LENGTH = 128
MAX_IDENTIFIER_LENGTH = 1024


class PartKind(StrEnum):
    TEXT = "text"
    JSON = "json"
    BINARY = "binary"
    # One provider's own block, verbatim (see provider_blocks.py): only in assistant messages.
    PROVIDER_BLOCK = "provider_block"


# The marker of the JSON part that holds an MCP result's `structuredContent` (the MIME type
# column is otherwise empty for JSON parts). The log keeps that part; the model's view leaves
# it out when the result already has text (see `model_view`).
STRUCTURED_CONTENT_MIME = "application/vnd.mcp.structured-content+json"


class _Shaped(Protocol):
    @property
    def kind(self) -> PartKind: ...

    @property
    def mime_type(self) -> str: ...


Shaped = TypeVar("Shaped", bound=_Shaped)


def model_view(parts: Sequence[Shaped]) -> list[Shaped]:
    """The parts of a tool result the model sees: one representation per result.

    MCP asks a server that returns `structuredContent` to put the same JSON in a text block
    too, so when the content has a text part the structured copy is left out; so it is when
    the content has media (an image, audio, a blob), which servers such as the filesystem's
    repeat, base64 and all, in `structuredContent`. When the content has neither, the
    structured JSON is the result and goes once. Works on parts and on their stored shapes
    alike (anything with `kind` and `mime_type`)."""
    if not any(p.kind is not PartKind.JSON for p in parts):
        return list(parts)
    return [
        p for p in parts if not (p.kind is PartKind.JSON and p.mime_type == STRUCTURED_CONTENT_MIME)
    ]


@dataclass(frozen=True, slots=True)
class ContentPart:
    """One content part. `data` holds the exact bytes: UTF-8 for text and JSON, the block as
    received for a provider block, whose envelope `mime_type` holds (`BlockEnvelope.encode`)."""

    kind: PartKind
    data: bytes
    mime_type: str = ""

    @classmethod
    def text(cls, value: str) -> ContentPart:
        return cls(PartKind.TEXT, utf8_sliced(value))

    def as_text(self) -> str:
        return self.data.decode()

    @classmethod
    def structured(cls, data: bytes) -> ContentPart:
        """An MCP result's `structuredContent`, as its JSON (see `model_view`)."""
        return cls(PartKind.JSON, data, STRUCTURED_CONTENT_MIME)

    @classmethod
    def provider_block(cls, envelope: BlockEnvelope, data: bytes) -> ContentPart:
        return cls(PartKind.PROVIDER_BLOCK, data, envelope.encode())

    @property
    def envelope(self) -> BlockEnvelope:
        """A provider block's envelope (only for a part of that kind)."""
        return BlockEnvelope.decode(self.mime_type)


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    name: str
    arguments_json: str


class RecordKind(StrEnum):
    USER_MESSAGE = "user_message"
    ASSISTANT_MESSAGE = "assistant_message"
    TOOL_RESULT = "tool_result"
    # A summary standing for a range of earlier records (runlog/compaction.py).
    COMPACTION = "compaction"


@dataclass(frozen=True, slots=True)
class Record:
    """A record as appended; the fields that do not apply to its kind stay empty."""

    kind: RecordKind
    content: tuple[ContentPart, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    call_id: str = ""
    server: str = ""
    tool: str = ""
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class StoredRecord:
    run_id: str
    sequence: int
    create_time: datetime
    handle: str
    record: Record


@dataclass(frozen=True, slots=True)
class AppendedRecord:
    sequence: int
    handle: str


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """A tool call's result as first recorded: what a retry of the call gets back."""

    sequence: int
    handle: str
    is_error: bool
    result_json: bytes


@dataclass(frozen=True, slots=True)
class Run:
    run_id: str
    tenant: str
    spec_name: str
    spec_version: int
    tool_restrictions: tuple[ToolGrant, ...]
    create_time: datetime


class AllTenants(Enum):
    """Its one value, :data:`ALL_TENANTS`, lists every tenant's Runs (the inspectors' view); a
    tenant's name lists that tenant's only. Never the empty string, which a request leaves
    when it omits the tenant."""

    ALL_TENANTS = "all tenants"


ALL_TENANTS: Final = AllTenants.ALL_TENANTS


@dataclass(frozen=True, slots=True)
class ListedRun:
    """A Run as listed: the Run, its record count and, when the listing was asked for it,
    the time of its last record (its create time before any)."""

    run: Run
    records: int
    last_activity: datetime | None


def validate_record(record: Record, field_path: str) -> None:
    """Refuse records a later reader could not make sense of; nothing is stored on failure."""
    if record.kind is RecordKind.USER_MESSAGE and not record.content:
        raise field_required(f"{field_path}.user_message.content")
    if record.kind is RecordKind.TOOL_RESULT:
        if not record.call_id:
            raise field_required(f"{field_path}.tool_result.call_id")
        for name in ("call_id", "server", "tool"):
            _validate_identifier(getattr(record, name), f"{field_path}.tool_result.{name}")
    for index, call in enumerate(record.tool_calls):
        call_path = f"{field_path}.assistant_message.tool_calls[{index}]"
        if not call.call_id:
            raise field_required(f"{call_path}.call_id")
        if not call.name:
            raise field_required(f"{call_path}.name")
        _validate_identifier(call.call_id, f"{call_path}.call_id")
        _validate_identifier(call.name, f"{call_path}.name")
    spelled: set[tuple[str, str]] = set()
    for index, part in enumerate(record.content):
        part_path = f"{field_path}.{record.kind.value}.content[{index}]"
        if part.kind is PartKind.PROVIDER_BLOCK:
            _validate_provider_block(record, part, f"{part_path}.provider_block", spelled)
        if part.kind is PartKind.BINARY:
            if not part.mime_type:
                raise field_required(f"{part_path}.binary.mime_type")
            _validate_identifier(part.mime_type, f"{part_path}.binary.mime_type")
        if part.kind is PartKind.JSON:
            try:
                # Decode first: json.loads would also accept UTF-16 and UTF-32 bytes.
                bounded_loads(part.data.decode())
            except ValueError as error:
                raise field_invalid(f"{part_path}.json", f"not UTF-8 JSON: {error}") from None


def _validate_provider_block(
    record: Record, part: ContentPart, field_path: str, spelled: set[tuple[str, str]]
) -> None:
    """A provider block is untrusted and opaque: bounded, one JSON object (so that the body it
    is spliced into stays JSON), in an assistant message, spelling at most one of its calls."""
    if record.kind is not RecordKind.ASSISTANT_MESSAGE:
        raise field_invalid(field_path, "a provider block belongs in an assistant message")
    envelope = part.envelope
    if not envelope.block_type:
        raise field_required(f"{field_path}.type")
    _validate_identifier(envelope.block_type, f"{field_path}.type")
    if len(part.data) > MAX_PROVIDER_BLOCK_BYTES:
        raise field_invalid(
            f"{field_path}.json",
            f"{len(part.data)} bytes, over the limit of {MAX_PROVIDER_BLOCK_BYTES}",
        )
    try:
        value = bounded_loads(part.data.decode())
    except ValueError as error:
        raise field_invalid(f"{field_path}.json", f"not UTF-8 JSON: {error}") from None
    if not isinstance(value, dict):
        raise field_invalid(f"{field_path}.json", "must be one JSON object")
    if envelope.call_id:
        _validate_identifier(envelope.call_id, f"{field_path}.call_id")
        if envelope.call_id not in {call.call_id for call in record.tool_calls}:
            raise field_invalid(
                f"{field_path}.call_id", "names no tool call of this assistant message"
            )
        key = (envelope.provider.value, envelope.call_id)
        if key in spelled:
            raise field_invalid(
                f"{field_path}.call_id", "another block of this provider spells the same call"
            )
        spelled.add(key)


def _validate_identifier(value: str, field_path: str) -> None:
    """Names and ids are short strings without NUL (content, by contrast, may hold anything)."""
    if "\x00" in value:
        raise field_invalid(field_path, "must not contain NUL characters")
    if len(value) > MAX_IDENTIFIER_LENGTH:
        raise field_invalid(field_path, f"longer than {MAX_IDENTIFIER_LENGTH} characters")


def validate_request_id(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID_LENGTH:
        raise field_invalid("request_id", f"longer than {MAX_REQUEST_ID_LENGTH} characters")
    if "\x00" in request_id:
        raise field_invalid("request_id", "must not contain NUL characters")


def records_fingerprint(records: tuple[Record, ...]) -> str:
    """A digest of exactly what was appended, to tell a retry from a reused request id."""
    digest = hashlib.sha256()

    def put(value: bytes) -> None:
        digest.update(struct.pack(">Q", len(value)))
        digest.update(value)

    for record in records:
        put(record.kind.value.encode())
        for text in (record.call_id, record.server, record.tool, str(record.is_error)):
            put(text.encode())
        put(struct.pack(">Q", len(record.content)))
        for part in record.content:
            put(part.kind.value.encode())
            put(part.mime_type.encode())
            put(part.data)
        put(struct.pack(">Q", len(record.tool_calls)))
        for call in record.tool_calls:
            for text in (call.call_id, call.name, call.arguments_json):
                put(text.encode())
    return digest.hexdigest()

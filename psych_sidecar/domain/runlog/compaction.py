"""Compaction in the Run log: the `compaction` record a host appends once it has had the
history summarised (the policy that proposes it is in compaction_policy.py).

A compaction never removes anything: the log keeps every record, and the record says which
records its summary stands for (`CompactionRange`, always whole turns). Prompt assembly then
projects zone 3 as the latest summary followed by the records after its range
(domain/prompt/compaction.py); `read_history` and `read_tool_output` still read the rest.

The range is stored as the record's last part, a JSON part marked with
`COMPACTION_RANGE_MIME` (as an MCP result's structured content is marked), so the log's
tables need no column for it and a retried append is compared on it like on any part.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.errors import field_invalid, field_required
from psych_sidecar.domain.runlog.content import RecordSkeleton
from psych_sidecar.domain.runlog.runs import ContentPart, PartKind, Record, RecordKind

COMPACTION_RANGE_MIME = "application/vnd.psych.compaction-range+json"


@dataclass(frozen=True, slots=True)
class CompactionRange:
    """The records a compaction's summary stands for, both ends included: whole turns."""

    first_sequence: int
    last_sequence: int


def compaction_record(summary: Sequence[ContentPart], covered: CompactionRange) -> Record:
    """A compaction record as stored: the summary's parts, then the range."""
    marker = canonical_json(
        {"first_sequence": covered.first_sequence, "last_sequence": covered.last_sequence}
    )
    return Record(
        RecordKind.COMPACTION,
        content=(*summary, ContentPart(PartKind.JSON, marker, COMPACTION_RANGE_MIME)),
    )


def split_compaction(
    content: Sequence[ContentPart],
) -> tuple[tuple[ContentPart, ...], CompactionRange]:
    """A stored compaction record's summary parts and range."""
    *summary, marker = content
    value = json.loads(marker.data)
    return tuple(summary), CompactionRange(value["first_sequence"], value["last_sequence"])


def validate_compaction_record(record: Record, field_path: str) -> None:
    """The record alone: a text summary and a range of at least one record."""
    path = f"{field_path}.compaction"
    if not record.content or record.content[-1].mime_type != COMPACTION_RANGE_MIME:
        raise field_required(f"{path}.last_sequence")
    summary, covered = split_compaction(record.content)
    if not summary:
        raise field_required(f"{path}.summary")
    for index, part in enumerate(summary):
        if part.kind is not PartKind.TEXT:
            raise field_invalid(f"{path}.summary[{index}]", "a summary is text")
    if covered.first_sequence <= 0:
        raise field_required(f"{path}.first_sequence")
    if covered.last_sequence < covered.first_sequence:
        raise field_invalid(f"{path}.last_sequence", "must not be less than first_sequence")


def latest_compaction(skeletons: Sequence[RecordSkeleton]) -> RecordSkeleton | None:
    return next((s for s in reversed(skeletons) if s.kind is RecordKind.COMPACTION), None)


def check_compaction_in_log(
    covered: CompactionRange,
    previous: CompactionRange | None,
    skeletons: Sequence[RecordSkeleton],
    field_path: str,
) -> None:
    """The range against the log it is appended to: it continues the latest compaction (the
    record after its range; a repeat of the same range, a retry or a new summary of it, is
    accepted too) and ends at a turn boundary, just before a user message."""
    path = f"{field_path}.compaction"
    start = 1 if previous is None else previous.last_sequence + 1
    repeat = previous is not None and covered == previous
    if not repeat and covered.first_sequence != start:
        raise field_invalid(
            f"{path}.first_sequence",
            f"must be {start}, the first record after the previous compaction's range "
            "(AssemblePrompt's proposal names it)",
        )
    following = {s.sequence: s for s in skeletons}.get(covered.last_sequence + 1)
    if following is None or following.kind is not RecordKind.USER_MESSAGE:
        raise field_invalid(
            f"{path}.last_sequence",
            "must end a turn: the record after it must be a user message in the log",
        )

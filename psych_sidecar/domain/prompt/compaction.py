"""Compaction as a projection over the log (docs/prompt.md, "Compaction").

The log keeps every record. Once a host has appended a compaction record, zone 3 is that
summary (framed so the model knows how to reach the rest) followed by the records after its
range; only the latest compaction counts, since each summary is written over a prompt that
opens with the one before it.

When the estimate of a turn's first call crosses the policy's trigger, or any call's prompt
would not fit at all, AssemblePrompt proposes the next compaction: the range (from the record
after the previous compaction's range to the end of the turn before the recent turns kept
verbatim, always whole turns) and the summary call's bodies. A summary call is the call the
host would have made with its transient message replaced by the request for the summary, so
it reads the cached prefix that call would have read; when that call would not fit, the
summary call's history stops at the end of the range (still a prefix of it), at the latest
turn boundary that fits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from psych_sidecar.domain.errors import ContextBudgetExceeded, field_invalid
from psych_sidecar.domain.prompt.zones import HistoryEntry, PromptMessage, Role
from psych_sidecar.domain.runlog import (
    CompactionPolicy,
    CompactionRange,
    ContentPart,
    LogReader,
    PartKind,
    RecordKind,
    RecordSkeleton,
    latest_compaction,
    split_compaction,
    validate_compaction,
)

# How much of the first kept user message the summary request quotes, so the model can tell
# where the span to summarise ends.
QUOTED_CHARS = 120


@dataclass(frozen=True, slots=True)
class CompactedLog:
    """The log as zone 3 sees it: the latest compaction (if any) and the records after it."""

    # The latest compaction's range, its summary and the turns it covers (0 when none).
    covered: CompactionRange | None
    summary: tuple[ContentPart, ...]
    covered_turns: int
    # The records zone 3 shows (after the range, compaction records left out).
    visible: list[RecordSkeleton]
    # The turn of each user message of the whole log, by sequence (1 for the first).
    turn_of: dict[int, int]


def compacted_log(log: LogReader, run_id: str, skeletons: Sequence[RecordSkeleton]) -> CompactedLog:
    turn_of: dict[int, int] = {}
    for skeleton in skeletons:
        if skeleton.kind is RecordKind.USER_MESSAGE:
            turn_of[skeleton.sequence] = len(turn_of) + 1
    latest = latest_compaction(skeletons)
    if latest is None:
        visible = [s for s in skeletons if s.kind is not RecordKind.COMPACTION]
        return CompactedLog(None, (), 0, visible, turn_of)
    content = log.record_contents(run_id, [latest.sequence])[latest.sequence]
    summary, covered = split_compaction(content)
    visible = [
        s
        for s in skeletons
        if s.sequence > covered.last_sequence and s.kind is not RecordKind.COMPACTION
    ]
    turns = sum(1 for sequence in turn_of if sequence <= covered.last_sequence)
    return CompactedLog(covered, summary, turns, visible, turn_of)


def _cut(text: str, max_bytes: int) -> str:
    """The longest prefix of `text` (whole characters) of at most `max_bytes` UTF-8 bytes."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode(errors="ignore")


def summary_entry(compacted: CompactedLog, summary_max_tokens: int) -> HistoryEntry | None:
    """The history's first message after a compaction: the framing, then the summary (cut
    at the policy's cap; the log keeps it whole)."""
    if compacted.covered is None:
        return None
    covered = compacted.covered
    text = "\n".join(p.as_text() for p in compacted.summary if p.kind is PartKind.TEXT)
    shown = _cut(text, 4 * summary_max_tokens)
    if shown != text:
        shown += f"\n[The summary is cut here, at its cap of {summary_max_tokens} tokens.]"
    framing = (
        f"[Summary of turns 1 to {compacted.covered_turns} of this conversation (records 1 to "
        f"{covered.last_sequence}), compacted to save room. Nothing is lost: read_history "
        'reads those records by turn or sequence and greps them (read_history(grep="...")), '
        "and read_tool_output still reads any tool result by its handle.]"
    )
    return HistoryEntry(RecordKind.USER_MESSAGE, (ContentPart.text(f"{framing}\n\n{shown}"),))


@dataclass(frozen=True, slots=True)
class CompactionProposal:
    """The next compaction: what it covers, the summary call's bodies, and why it is due."""

    covered: CompactionRange
    first_turn: int
    last_turn: int
    anthropic_json: bytes
    openai_json: bytes
    openai_responses_json: bytes
    gemini_json: bytes
    estimated_tokens: int
    trigger_tokens: int
    summary_max_tokens: int
    # The call's own prompt would not fit: compact before the call.
    required: bool
    reason: str
    # The anthropic-beta values the summary call's Anthropic body needs.
    anthropic_betas: tuple[str, ...] = ()


def summary_request(
    policy: CompactionPolicy, last_turn: int, kept_opening: str | None
) -> PromptMessage:
    """The message that replaces the transient one in the summary call."""
    if kept_opening is None:
        span = "Summarise the conversation above"
    else:
        quoted = kept_opening[:QUOTED_CHARS].replace("\n", " ")
        more = "…" if len(kept_opening) > QUOTED_CHARS else ""
        span = (
            f"Summarise the conversation above from its start through the end of turn "
            f'{last_turn}: everything before the user message that begins "{quoted}{more}"'
        )
    cap = policy.summary_tokens
    text = (
        f"[Compaction request] {span}. The summary replaces that part of the conversation in "
        "your context (the full records stay readable with read_history), so include what "
        f"an earlier summary in it says. {policy.instructions} Write at most {cap} tokens "
        f"(about {4 * cap} characters) of plain text, and call no tool."
    )
    return PromptMessage(Role.USER, (ContentPart.text(text),))


class Measured(Protocol):
    @property
    def estimated_tokens(self) -> int: ...


BodiesT = TypeVar("BodiesT", bound=Measured)


def range_end(visible: Sequence[RecordSkeleton], kept_turns: int) -> int | None:
    """Where the range ends in the visible log (the index of the first record kept: the start
    of the earliest of the `kept_turns` turns kept verbatim before the current one), or None
    when there is nothing before it to compact."""
    starts = [i for i, s in enumerate(visible) if s.kind is RecordKind.USER_MESSAGE]
    if len(starts) > kept_turns and starts[-1 - kept_turns] > 0:
        return starts[-1 - kept_turns]
    return None


def opens_its_turn(visible: Sequence[RecordSkeleton]) -> bool:
    """Whether the call is its turn's first (the latest record shown is the user message).
    A compaction over the trigger is proposed only then, and mid-turn only when the prompt
    would not fit: within a turn nothing moves. A mid-turn compaction would rewrite the
    prefix the turn's earlier calls cached, and its summary call would carry the turn's
    results only for the next call to write them again after the summary."""
    return bool(visible) and visible[-1].kind is RecordKind.USER_MESSAGE


def choose_summary_call(
    visible: Sequence[RecordSkeleton],
    preferred_end: int,
    budget: int,
    whole: Callable[[], BodiesT] | None,
    cut: Callable[[int], BodiesT],
) -> tuple[int, BodiesT] | None:
    """The summary call: `whole()` (the would-be call's history, when there is one) if it
    fits the budget, else `cut(end)` (the history through the range) at the latest turn
    boundary up to `preferred_end` that fits; None when not even one turn does."""
    if whole is not None:
        bodies = whole()
        if bodies.estimated_tokens <= budget:
            return preferred_end, bodies
    ends = [
        i
        for i, s in enumerate(visible)
        if s.kind is RecordKind.USER_MESSAGE and 0 < i <= preferred_end
    ]
    found: tuple[int, BodiesT] | None = None
    low, high = 0, len(ends) - 1
    while low <= high:  # the estimate grows with the history: the last end that fits
        middle = (low + high) // 2
        bodies = cut(ends[middle])
        if bodies.estimated_tokens <= budget:
            found = (ends[middle], bodies)
            low = middle + 1
        else:
            high = middle - 1
    return found


def kept_opening(
    visible: Sequence[RecordSkeleton], end: int, contents: Mapping[int, tuple[ContentPart, ...]]
) -> str:
    """The text the first kept user message begins with."""
    parts = contents.get(visible[end].sequence, ())
    return "\n".join(p.as_text() for p in parts if p.kind in (PartKind.TEXT, PartKind.JSON))


def call_policy(
    spec_policy: CompactionPolicy, override: CompactionPolicy | None, budget: int
) -> CompactionPolicy:
    """The Spec's policy with the call's override applied, checked."""
    if override is None:
        policy = spec_policy
    else:
        validate_compaction(override, "compaction")
        if not spec_policy.enabled and override != CompactionPolicy():
            raise field_invalid(
                "compaction",
                "the Spec has no compaction policy to override: publish one with a trigger "
                "(its read_history tool is part of zone 1)",
            )
        policy = spec_policy.over(override)
    if policy.enabled and policy.summary_tokens >= budget:
        raise field_invalid(
            "compaction.summary_max_tokens",
            f"{policy.summary_tokens} leaves no room in the context budget of {budget} tokens",
        )
    return policy


def turn_at(turn_of: Mapping[int, int], sequence: int) -> int:
    """The turn a record belongs to: the user messages up to it (0 before the first)."""
    return sum(1 for start in turn_of if start <= sequence)


def with_advice(exceeded: ContextBudgetExceeded, policy: CompactionPolicy) -> ContextBudgetExceeded:
    """The guard's refusal, saying what the host can do about it."""
    if policy.enabled:
        advice = (
            " Even a summary of every earlier turn and the current turn do not fit: raise "
            "context_window_tokens, lower max_tokens or output_reserve_tokens, or cap the "
            "current turn's results with current_turn_result_tokens."
        )
    else:
        advice = (
            " Set a compaction policy (Spec.compaction with trigger_tokens or "
            "trigger_fraction) so that AssemblePrompt proposes summarising earlier turns, "
            "or raise context_window_tokens."
        )
    return ContextBudgetExceeded(
        str(exceeded) + advice,
        estimated_tokens=exceeded.estimated_tokens,
        full_estimated_tokens=exceeded.full_estimated_tokens,
        context_window_tokens=exceeded.context_window_tokens,
        output_reserve_tokens=exceeded.output_reserve_tokens,
        budget_tokens=exceeded.budget_tokens,
    )

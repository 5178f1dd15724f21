"""Which prior-turn tool results the model sees elided, and what it sees instead.

Elision is a projection at prompt-assembly time: the log keeps every byte and nothing here
writes. The algorithm runs over one batch (all tool results of one turn):

1. Sum the batch's estimates. Under the per-result threshold, elide nothing (the sum, not
   each result, short-circuits: many small results that add up are still processed).
2. Elide every result whose own estimate is at or over the per-result threshold.
3. Take the rest largest first and elide until the running total (full size for results
   kept, preview size for results elided) is under the per-batch threshold, or nothing is
   left.

A result whose view would not be shorter than its content goes through unchanged and does
not count as elided.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from psych_sidecar.domain.specs import EffectiveThresholds


@dataclass(frozen=True, slots=True)
class BatchResult:
    """One tool result of a batch: its sequence and its estimated tokens in full."""

    sequence: int
    tokens: int


def plan_batch(
    batch: Sequence[BatchResult],
    thresholds: EffectiveThresholds,
    view_tokens: Callable[[int], int | None],
) -> set[int]:
    """The sequences to elide. `view_tokens(sequence)` is the estimate of the elided view,
    or None when that result would go through unchanged."""
    if sum(result.tokens for result in batch) < thresholds.per_result_tokens:
        return set()
    elided: dict[int, int] = {}
    for result in batch:
        if result.tokens >= thresholds.per_result_tokens:
            view = view_tokens(result.sequence)
            if view is not None:
                elided[result.sequence] = view
    running = sum(elided.get(result.sequence, result.tokens) for result in batch)
    remaining = sorted(
        (result for result in batch if result.sequence not in elided),
        key=lambda result: (-result.tokens, result.sequence),
    )
    for result in remaining:
        if running < thresholds.per_batch_tokens:
            break
        view = view_tokens(result.sequence)
        if view is not None:
            elided[result.sequence] = view
            running -= result.tokens - view
    return set(elided)


def first_step_candidates(
    batch: Sequence[BatchResult], thresholds: EffectiveThresholds
) -> list[int]:
    """The results step 2 elides unless their view would be unchanged: what a caller can
    prepare in bulk before running `plan_batch`."""
    if sum(result.tokens for result in batch) < thresholds.per_result_tokens:
        return []
    return [r.sequence for r in batch if r.tokens >= thresholds.per_result_tokens]


def _omission_line(omitted: int) -> str:
    return f"\n[... {omitted} characters omitted ...]\n"


def _guidance(total_chars: int, head_chars: int, handle: str) -> str:
    return (
        f"\n[Elided from this prompt: {total_chars} characters in full. Read the rest with "
        f'read_tool_output(handle="{handle}"): offset {head_chars} continues after the head; '
        "offset and limit count characters; grep takes an RE2 pattern.]"
    )


def preview_chars(total_chars: int, handle: str, thresholds: EffectiveThresholds) -> int:
    """The length of the head-and-tail preview of a success, known before any content is
    read (the frame around head and tail is ASCII and depends only on sizes)."""
    head, tail = thresholds.preview_head_chars, thresholds.preview_tail_chars
    omitted = total_chars - head - tail
    return head + tail + len(_omission_line(omitted)) + len(_guidance(total_chars, head, handle))


def previews_success(total_chars: int, handle: str, thresholds: EffectiveThresholds) -> bool:
    """Whether a success is shown as a preview: only when head and tail do not overlap and
    the preview is shorter than the content, so a preview never truncates something small."""
    head, tail = thresholds.preview_head_chars, thresholds.preview_tail_chars
    return total_chars > head + tail and preview_chars(total_chars, handle, thresholds) < (
        total_chars
    )


def truncates_failure(total_chars: int, thresholds: EffectiveThresholds) -> bool:
    return total_chars > thresholds.failure_truncation_chars


def success_preview(
    head: str, tail: str, total_chars: int, handle: str, thresholds: EffectiveThresholds
) -> str:
    """Head, an ellipsis line saying how much is left out, tail, then guidance with the
    handle."""
    omitted = total_chars - len(head) - len(tail)
    return head + _omission_line(omitted) + tail + _guidance(total_chars, len(head), handle)

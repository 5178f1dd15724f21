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
not count as elided (see `plan_view`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from psych_sidecar.domain.runlog import EffectiveThresholds, Piece, TextLayout


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


def _guidance(total_chars: int, head_chars: int, handle: str, json_like: bool = True) -> str:
    """The line closing a preview. `json_like` (the head opens a JSON object or array) adds
    the query; a preview's size is planned with it, the longer of the two."""
    query = (
        "; query takes a JMESPath expression over the JSON (e.g. \"items[?id=='x']\")"
        if json_like
        else ""
    )
    return (
        f"\n[Elided from this prompt: {total_chars} characters in full. Read the rest with "
        f'read_tool_output(handle="{handle}"): offset {head_chars} continues after the head; '
        f"offset and limit count characters; grep takes an RE2 pattern{query}.]"
    )


def _opens_json(head: str) -> bool:
    return head.lstrip()[:1] in ("{", "[")


def _binary_guidance(handle: str) -> str:
    return (
        "\n[Binary content is not repeated in this prompt; read_tool_output"
        f'(handle="{handle}") returns it.]'
    )


def preview_chars(total_chars: int, handle: str, thresholds: EffectiveThresholds) -> int:
    """The length of the head-and-tail preview of a success, known before any content is
    read (the frame around head and tail is ASCII and depends only on sizes): at most this
    long, as long when the head opens JSON."""
    head, tail = thresholds.preview_head_chars, thresholds.preview_tail_chars
    omitted = total_chars - head - tail
    return head + tail + len(_omission_line(omitted)) + len(_guidance(total_chars, head, handle))


class ViewKind(Enum):
    PREVIEW = "preview"  # head, omission line, tail, guidance
    MARKERS = "markers"  # a short rendering whose binary parts are left out, and guidance
    TRUNCATED = "truncated"  # a failure's first characters, nothing else


@dataclass(frozen=True, slots=True)
class ViewPlan:
    """What an elided result will show, planned from its shape: the characters of its text
    rendering to fetch (`head`, and `tail` for a preview) and how to frame them."""

    kind: ViewKind
    head: tuple[Piece, ...]
    tail: tuple[Piece, ...]
    total_chars: int
    content_bytes: int
    handle: str

    def render(self, head: str, tail: str) -> str | None:
        """The view, or None when it would not be smaller than the stored content (tiny
        binary parts can make a rendering longer than their bytes)."""
        if self.kind is ViewKind.TRUNCATED:
            view = head
        elif self.kind is ViewKind.MARKERS:
            view = head + _binary_guidance(self.handle)
        else:
            omitted = self.total_chars - len(head) - len(tail)
            view = (
                head
                + _omission_line(omitted)
                + tail
                + _guidance(self.total_chars, len(head), self.handle, _opens_json(head))
            )
        return view if len(view.encode()) < self.content_bytes else None


def plan_view(
    layout: TextLayout,
    content_bytes: int,
    is_error: bool,
    handle: str,
    thresholds: EffectiveThresholds,
) -> ViewPlan | None:
    """How a result chosen for elision is shown, or None when it goes through unchanged.

    A view is always smaller than what it replaces: fewer UTF-8 bytes than the stored
    content, and for text fewer characters too. A success gets the head-and-tail preview
    when head and tail do not overlap and the preview has fewer characters than the
    content; failing that, a result with binary parts shows its rendering (markers in place
    of the bytes). A failure shows the first characters of its rendering when that has more,
    or when binary parts stand in it.
    """
    total = layout.total_chars
    t = thresholds
    if is_error:
        if total > t.failure_truncation_chars or layout.has_binary:
            head = layout.pieces(0, t.failure_truncation_chars)
            return ViewPlan(ViewKind.TRUNCATED, tuple(head), (), total, content_bytes, handle)
        return None
    head_chars, tail_chars = t.preview_head_chars, t.preview_tail_chars
    if total > head_chars + tail_chars and preview_chars(total, handle, t) < total:
        head = layout.pieces(0, head_chars)
        tail = layout.pieces(total - tail_chars, total)
        return ViewPlan(ViewKind.PREVIEW, tuple(head), tuple(tail), total, content_bytes, handle)
    if layout.has_binary:
        pieces = tuple(layout.pieces(0, total))
        return ViewPlan(ViewKind.MARKERS, pieces, (), total, content_bytes, handle)
    return None

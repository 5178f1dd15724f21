"""The elided views of one assembly's tool results, and which results are sent elided before
the context guard looks: prior-turn results by the elision algorithm, one turn at a time, and
current-turn results over the budget's optional cap.

A view is built from record metadata and only the characters it shows (read as byte ranges
of the parts), never the whole content; views and the sizes the thresholds judge are cached
per record, since both are functions of immutable rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.estimate import estimate_text_tokens, estimate_tokens
from psych_sidecar.domain.prompt.elision import (
    BatchResult,
    ViewPlan,
    first_step_candidates,
    plan_batch,
    plan_view,
)
from psych_sidecar.domain.prompt.zones import ToolResultView
from psych_sidecar.domain.runlog import (
    ContentPart,
    EffectiveThresholds,
    LogReader,
    RecordKind,
    RecordSkeleton,
    TextLayout,
    fetch_text,
    model_view,
)

# A view is a function of a record (immutable) and its Run's Spec (immutable): cached per
# record as a 1-tuple, so that "goes through unchanged" (None) is cached too.
ViewCache = ImmutableCache[tuple[str, int], tuple[ToolResultView | None]]
# The bytes of each tool result's model view (`model_view`): immutable per record.
ViewSizeCache = ImmutableCache[tuple[str, int], int]


def prior_batches(skeletons: Sequence[RecordSkeleton]) -> list[list[RecordSkeleton]]:
    """The tool results of each turn before the last user message, one list per turn."""
    last_user = max(
        (i for i, s in enumerate(skeletons) if s.kind is RecordKind.USER_MESSAGE), default=-1
    )
    batches: list[list[RecordSkeleton]] = [[]]
    for skeleton in skeletons[: max(last_user, 0)]:
        if skeleton.kind is RecordKind.USER_MESSAGE:
            batches.append([])
        elif skeleton.kind is RecordKind.TOOL_RESULT:
            batches[-1].append(skeleton)
    return [batch for batch in batches if batch]


def current_results(skeletons: Sequence[RecordSkeleton]) -> list[RecordSkeleton]:
    """The tool results of the current turn: after the last user message (all of them when
    there is none)."""
    last_user = max(
        (i for i, s in enumerate(skeletons) if s.kind is RecordKind.USER_MESSAGE), default=-1
    )
    return [s for s in skeletons[last_user + 1 :] if s.kind is RecordKind.TOOL_RESULT]


def view_sizes(
    log: LogReader, cache: ViewSizeCache, run_id: str, skeletons: Sequence[RecordSkeleton]
) -> dict[int, int]:
    """The UTF-8 bytes of each tool result as the model sees it in full: its content less
    a structured copy `model_view` leaves out. Sizes and thresholds are computed on this."""
    sizes: dict[int, int] = {}
    wanted = []
    for skeleton in skeletons:
        if skeleton.kind is not RecordKind.TOOL_RESULT:
            continue
        cached = cache.get((run_id, skeleton.sequence))
        if cached is None:
            wanted.append(skeleton.sequence)
        else:
            sizes[skeleton.sequence] = cached
    if wanted:
        metas = log.part_metas(run_id, wanted)
        for sequence in wanted:
            size = sum(p.byte_length for p in model_view(metas.get(sequence, [])))
            sizes[sequence] = size
            cache.put((run_id, sequence), size)
    return sizes


@dataclass(kw_only=True, slots=True, eq=False)
class ElidedViews:
    """Elided views of one assembly's results, built on demand and in bulk: part shapes,
    then only the characters each view shows. Views built once are kept in the shared cache,
    so the steps of a turn do not fetch the same previews again."""

    log: LogReader
    cache: ViewCache
    run_id: str
    thresholds: EffectiveThresholds
    skeletons: dict[int, RecordSkeleton]
    view_bytes: dict[int, int]
    views: dict[int, ToolResultView | None] = field(default_factory=dict, init=False)

    def prepare(self, sequences: Sequence[int]) -> None:
        wanted = []
        for sequence in sequences:
            if sequence in self.views:
                continue
            cached = self.cache.get((self.run_id, sequence))
            if cached is None:
                wanted.append(sequence)
            else:
                self.views[sequence] = cached[0]
        if not wanted:
            return
        metas = self.log.part_metas(self.run_id, wanted)
        plans: list[tuple[RecordSkeleton, ViewPlan]] = []
        for sequence in wanted:
            skeleton = self.skeletons[sequence]
            layout = TextLayout(model_view(metas.get(sequence, [])))
            plan = plan_view(
                layout,
                self.view_bytes[sequence],
                skeleton.is_error,
                skeleton.handle,
                self.thresholds,
            )
            if plan is None:
                self.views[sequence] = None  # small enough to go through unchanged
            else:
                plans.append((skeleton, plan))
        requests = [
            (skeleton.sequence, pieces)
            for skeleton, plan in plans
            for pieces in (plan.head, plan.tail)
        ]
        texts = iter(fetch_text(self.log, self.run_id, requests))
        for skeleton, plan in plans:
            shown = plan.render(next(texts), next(texts))
            self.views[skeleton.sequence] = (
                None
                if shown is None
                else ToolResultView(
                    skeleton.call_id,
                    skeleton.is_error,
                    (ContentPart.text(shown),),
                    True,
                    skeleton.handle,
                )
            )
        for sequence in wanted:
            self.cache.put((self.run_id, sequence), (self.views[sequence],))

    def tokens(self, sequence: int) -> int | None:
        self.prepare([sequence])
        view = self.views[sequence]
        return None if view is None else estimate_text_tokens(view.content[0].as_text())


def prior_turn_elided(
    skeletons: Sequence[RecordSkeleton],
    thresholds: EffectiveThresholds,
    view_bytes: dict[int, int],
    views: ElidedViews,
) -> dict[int, ToolResultView]:
    """The prior turns' results the elision algorithm elides, each turn a batch."""
    batches = [
        [BatchResult(s.sequence, estimate_tokens(view_bytes[s.sequence])) for s in batch]
        for batch in prior_batches(skeletons)
    ]
    views.prepare([s for batch in batches for s in first_step_candidates(batch, thresholds)])
    elided: dict[int, ToolResultView] = {}
    for batch in batches:
        for sequence in plan_batch(batch, thresholds, views.tokens):
            view = views.views[sequence]
            assert view is not None
            elided[sequence] = view
    return elided


def capped_results(
    cap: int | None,
    skeletons: Sequence[RecordSkeleton],
    view_bytes: Mapping[int, int],
    views: ElidedViews,
) -> dict[int, ToolResultView]:
    """The current turn's results over the budget's optional cap, elided: a function of each
    result alone, so the same at every step of the turn."""
    if cap is None:
        return {}
    over = [
        s.sequence
        for s in current_results(skeletons)
        if estimate_tokens(view_bytes[s.sequence]) > cap
    ]
    views.prepare(over)
    return {sequence: view for sequence in over if (view := views.views[sequence]) is not None}

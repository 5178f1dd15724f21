"""The context guard: when the current turn's results in full would not fit the budget (the
context window less the output reserve), it elides some of them, the one place beyond the
spec's letter (docs/prompt.md).

It keeps the promise that the steps of a turn share the provider's cached prefix: its decision
is replayed at each step of the turn so far and only grows within a turn, so what an earlier
call sent elided stays elided, and what it sent in full is elided only when the newer results
cannot make room.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from psych_sidecar.domain.errors import ContextBudgetExceeded
from psych_sidecar.domain.estimate import estimate_text_tokens, estimate_tokens
from psych_sidecar.domain.prompt.elided_views import ElidedViews, current_results
from psych_sidecar.domain.prompt.zones import ToolResultView
from psych_sidecar.domain.runlog import RecordKind, RecordSkeleton

# When the context guard must elide a result an earlier call of the turn sent in full, it
# frees a tenth of the budget, so that one miss leaves room for the rest of the turn.
HEADROOM_DIVISOR = 10


@dataclass(frozen=True, slots=True)
class GuardedResult:
    """A current-turn result the context guard elided: its full and elided estimates."""

    call_id: str
    handle: str
    full_tokens: int
    view_tokens: int


@dataclass(frozen=True, slots=True)
class GuardDecision:
    """What the context guard decided for one call (see docs/prompt.md)."""

    context_window_tokens: int
    output_reserve_tokens: int
    estimated_tokens: int  # the prompt as assembled
    full_estimated_tokens: int  # with the current turn's results in full
    elided: tuple[GuardedResult, ...] = ()
    reason: str = ""


class Estimated(Protocol):
    """A prompt as the guard measures it (`AssembledPrompt`)."""

    @property
    def estimated_tokens(self) -> int: ...


PromptT = TypeVar("PromptT", bound=Estimated)


def apply_context_guard(
    build: Callable[[Mapping[int, ToolResultView], int], PromptT],
    in_full: PromptT,
    *,
    skeletons: Sequence[RecordSkeleton],
    elided: Mapping[int, ToolResultView],
    views: ElidedViews,
    view_bytes: Mapping[int, int],
    window: int,
    reserve: int,
) -> tuple[PromptT, GuardDecision, dict[int, ToolResultView]]:
    """The prompt within the budget, the guard's decision and the current-turn results it
    elided. `build(guarded, end)` is the prompt over the log's first `end` records with the
    `guarded` results elided too, `in_full` the whole log's with none; `elided` are the
    results sent elided anyway. Raises ContextBudgetExceeded when even eliding every
    current-turn result it can does not fit."""
    full = in_full.estimated_tokens
    budget = window - reserve
    if full <= budget:
        return in_full, GuardDecision(window, reserve, full, full), {}
    # It replays its decision at each step of the turn so far (every assistant message of
    # the turn is where an earlier call ended), never returning a result to full: what an
    # earlier call sent elided stays elided, and what it sent in full is elided only when
    # the newer results cannot make room, so the previous call's prefix survives.
    current = [s for s in current_results(skeletons) if s.sequence not in elided]
    views.prepare([s.sequence for s in current])
    elidable = [s for s in current if views.views[s.sequence] is not None]
    position = {s.sequence: index for index, s in enumerate(skeletons)}
    guarded: dict[int, ToolResultView] = {}
    chosen: list[GuardedResult] = []
    previous_end = 0
    assembled = attempt = in_full
    estimate = full
    forced = False  # whether an earlier step of the turn had to elide an earlier result

    def elide(skeleton: RecordSkeleton) -> int:
        """Elide a current-turn result; the tokens its view saves."""
        view = views.views[skeleton.sequence]
        assert view is not None
        full_tokens = estimate_tokens(view_bytes[skeleton.sequence])
        view_tokens = estimate_text_tokens(view.content[0].as_text())
        guarded[skeleton.sequence] = view
        chosen.append(GuardedResult(skeleton.call_id, skeleton.handle, full_tokens, view_tokens))
        return max(full_tokens - view_tokens, 0)

    def elide_until(target: int, order: list[RecordSkeleton], end: int) -> None:
        """Elide from the front of `order` until the prompt over the first `end` records is
        within `target` or nothing is left, rebuilding it whenever the estimates say it fits."""
        nonlocal attempt, estimate
        while estimate > target and order:
            projected = estimate
            while order and projected > target:
                projected -= elide(order.pop(0))
            attempt = build(guarded, end)
            estimate = attempt.estimated_tokens

    for end in _step_ends(skeletons):
        attempt = in_full if end == len(skeletons) and not guarded else build(guarded, end)
        estimate = attempt.estimated_tokens
        if estimate <= budget:
            assembled, previous_end = attempt, end
            continue
        present = [s for s in elidable if position[s.sequence] < end and s.sequence not in guarded]
        newer = [s for s in present if position[s.sequence] >= previous_end]
        earlier = [s for s in present if position[s.sequence] < previous_end]
        # Results added since the previous step first, largest first: the cached prefix
        # ends before them, so which one costs nothing.
        elide_until(
            budget, sorted(newer, key=lambda s: (-view_bytes[s.sequence], -s.sequence)), end
        )
        if estimate > budget and earlier:
            # Unavoidable: an earlier result the previous call sent in full must go, one
            # cache miss from the first one elided. The newest go first, so the miss
            # starts as late as it can, and until a tenth of the budget is free, so the
            # rest of the turn has room and the miss is not repeated at every step; if
            # the turn outgrows that room too, every earlier result goes at once.
            target = budget - budget // HEADROOM_DIVISOR if not forced else 0
            forced = True
            elide_until(target, sorted(earlier, key=lambda s: -s.sequence), end)
        assembled, previous_end = attempt, end
    if estimate > budget:
        raise ContextBudgetExceeded(
            f"the prompt is about {estimate} tokens even with the current turn's results "
            f"elided ({full} in full), over the budget of {budget} tokens (a context window "
            f"of {window} less {reserve} for the output)",
            estimated_tokens=estimate,
            full_estimated_tokens=full,
            context_window_tokens=window,
            output_reserve_tokens=reserve,
            budget_tokens=budget,
        )
    reason = (
        f"With the current turn's results in full the prompt would be about {full} tokens, "
        f"over the budget of {budget} (a context window of {window} less {reserve} for the "
        f"output); {len(chosen)} of them are elided to {estimate}, the newest first."
    )
    return assembled, GuardDecision(window, reserve, estimate, full, tuple(chosen), reason), guarded


def _step_ends(skeletons: Sequence[RecordSkeleton]) -> list[int]:
    """Where each call of the current turn ended its log: just before each of the turn's
    assistant messages (the answer to that call), then the log's end; as record counts."""
    last_user = max(
        (i for i, s in enumerate(skeletons) if s.kind is RecordKind.USER_MESSAGE), default=-1
    )
    ends = [
        index
        for index in range(last_user + 1, len(skeletons))
        if skeletons[index].kind is RecordKind.ASSISTANT_MESSAGE
    ]
    return [*ends, len(skeletons)]

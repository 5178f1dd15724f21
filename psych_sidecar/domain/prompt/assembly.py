"""AssemblePrompt: the exact prompt for one model call, from the log, the Spec and the request.

Assembly work follows what is sent, not what is stored: turn boundaries, sizes and error
flags come from record metadata; an elided result contributes only the characters of its
preview (read as byte ranges of its parts), never its whole content.

The elision boundary is strictly before the last user message: results of earlier turns
are subject to elision, the current turn's go in full. A record's view therefore changes
at most once per turn (when the next user message arrives) and is byte-identical across the
steps of a turn, so the provider's cached prefix survives them. The context guard keeps
that promise when it must elide current-turn results to fit the budget: its decision is
replayed step by step and only grows within a turn (see docs/prompt.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.errors import ContextBudgetExceeded, field_invalid
from psych_sidecar.domain.estimate import estimate_text_tokens, estimate_tokens
from psych_sidecar.domain.prompt.elision import (
    BatchResult,
    ViewPlan,
    first_step_candidates,
    plan_batch,
    plan_view,
)
from psych_sidecar.domain.prompt.journal import assembly_entry
from psych_sidecar.domain.prompt.ports import AssemblyJournal, TurnSurfaces
from psych_sidecar.domain.prompt.providers import anthropic_body, cache_key, openai_body
from psych_sidecar.domain.prompt.zones import (
    HistoryEntry,
    Prompt,
    ToolResultView,
    ZoneDigest,
    build_history,
    dynamic_tail,
    static_sections,
    transient_message,
    zone_digests,
)
from psych_sidecar.domain.runlog import (
    DEFAULT_CONTEXT_WINDOW_TOKENS,
    ContentPart,
    ContextBudget,
    EffectiveThresholds,
    LogReader,
    RecordKind,
    RecordSkeleton,
    RunService,
    SpecLookup,
    TextLayout,
    fetch_text,
    model_view,
    validate_context_budget,
)
from psych_sidecar.domain.surface import status_note

DEFAULT_MAX_TOKENS = 4096
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


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptCall:
    """What one model call asks of AssemblePrompt: the Run, the clock of its transient
    message, and the host's optional parts (empty: none; `max_tokens` 0: the default)."""

    run_id: str
    now: datetime
    host_tail: str = ""
    transient_note: str = ""
    model: str = ""
    max_tokens: int = 0
    # Overrides the Spec's context budget field by field.
    budget_override: ContextBudget | None = None


@dataclass(frozen=True, slots=True)
class AssembledPrompt:
    """One call's prompt, its per-zone sizes and hashes, both provider bodies and the
    context guard's decision: everything an assembly journal needs to record."""

    prompt: Prompt
    zones: tuple[ZoneDigest, ...]
    anthropic_json: bytes
    openai_json: bytes
    guard: GuardDecision | None = None
    # Results sent elided (prior-turn and by the guard), and the bytes their views left out
    # (full size minus what the view shows): for the operator's metrics.
    elided_results: int = 0
    elided_bytes_saved: int = 0
    # Of those, the ones the context guard elided and the bytes they saved.
    guard_bytes_saved: int = 0
    # Of those, the current-turn results over the budget's optional cap, and their bytes.
    capped_results: int = 0
    cap_bytes_saved: int = 0

    @property
    def estimated_tokens(self) -> int:
        """The estimator over the larger of the two bodies: what the guard measures."""
        return estimate_tokens(max(len(self.anthropic_json), len(self.openai_json)))


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


# A view is a function of a record (immutable) and its Run's Spec (immutable): cached per
# record as a 1-tuple, so that "goes through unchanged" (None) is cached too.
ViewCache = ImmutableCache[tuple[str, int], tuple[ToolResultView | None]]


class _ElidedViews:
    """Elided views of prior-turn results, built on demand and in bulk: part shapes, then
    only the characters each view shows. Views built once are kept in the shared cache, so
    the steps of a turn do not fetch the same previews again."""

    def __init__(
        self,
        *,
        log: LogReader,
        cache: ViewCache,
        run_id: str,
        thresholds: EffectiveThresholds,
        skeletons: dict[int, RecordSkeleton],
        view_bytes: dict[int, int],
    ) -> None:
        self._log = log
        self._view_bytes = view_bytes
        self._cache = cache
        self._run_id = run_id
        self._thresholds = thresholds
        self._skeletons = skeletons
        self.views: dict[int, ToolResultView | None] = {}

    def prepare(self, sequences: Sequence[int]) -> None:
        wanted = []
        for sequence in sequences:
            if sequence in self.views:
                continue
            cached = self._cache.get((self._run_id, sequence))
            if cached is None:
                wanted.append(sequence)
            else:
                self.views[sequence] = cached[0]
        if not wanted:
            return
        metas = self._log.part_metas(self._run_id, wanted)
        plans: list[tuple[RecordSkeleton, ViewPlan]] = []
        for sequence in wanted:
            skeleton = self._skeletons[sequence]
            layout = TextLayout(model_view(metas.get(sequence, [])))
            plan = plan_view(
                layout,
                self._view_bytes[sequence],
                skeleton.is_error,
                skeleton.handle,
                self._thresholds,
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
        texts = iter(fetch_text(self._log, self._run_id, requests))
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
            self._cache.put((self._run_id, sequence), (self.views[sequence],))

    def tokens(self, sequence: int) -> int | None:
        self.prepare([sequence])
        view = self.views[sequence]
        return None if view is None else estimate_text_tokens(view.content[0].as_text())


class PromptAssembler:
    def __init__(
        self,
        *,
        runs: RunService,
        specs: SpecLookup,
        log: LogReader,
        surfaces: TurnSurfaces,
        view_cache_size: int = 10_000,
        journal: AssemblyJournal | None = None,
    ) -> None:
        self._runs = runs
        self._specs = specs
        self._log = log
        # The Run's tool surface for this turn (TurnResolver.resolve_turn).
        self._surfaces = surfaces
        self._views = ViewCache(view_cache_size)
        # The bytes of each tool result's model view (`model_view`): immutable per record.
        self._view_sizes = ImmutableCache[tuple[str, int], int](view_cache_size * 10)
        # Told each prompt's metadata (never its content) after it is assembled.
        self._journal = journal

    def assemble(self, call: PromptCall) -> AssembledPrompt:
        """The prompt for one model call, told to the assembly journal."""
        return self._assemble(call, self._journal)

    def preview(self, call: PromptCall) -> AssembledPrompt:
        """The prompt the call would get, leaving no journal row (nothing was sent)."""
        return self._assemble(call, None)

    def _assemble(self, call: PromptCall, journal: AssemblyJournal | None) -> AssembledPrompt:
        run_id, model, max_tokens = call.run_id, call.model, call.max_tokens
        host_tail, transient_note, now = call.host_tail, call.transient_note, call.now
        budget_override = call.budget_override
        if max_tokens < 0:
            raise field_invalid("max_tokens", "must not be negative")
        max_tokens = max_tokens or DEFAULT_MAX_TOKENS
        if budget_override is not None:
            validate_context_budget(budget_override, "context_budget")
        run = self._runs.get(run_id)
        spec = self._specs.get(run.spec_name, run.spec_version)
        effective = spec.context_budget.over(budget_override or ContextBudget())
        window, reserve = _budget(effective)
        reserve = max_tokens if reserve is None else reserve
        if reserve >= window:
            raise field_invalid(
                "context_budget.output_reserve_tokens",
                f"the output reserve ({reserve} tokens) leaves no room in a context window "
                f"of {window} tokens",
            )
        thresholds = spec.effective_thresholds()
        skeletons = self._log.record_skeletons(run_id)
        view_bytes = self._view_bytes(run_id, skeletons)
        views = _ElidedViews(
            log=self._log,
            cache=self._views,
            run_id=run_id,
            thresholds=thresholds,
            skeletons={s.sequence: s for s in skeletons},
            view_bytes=view_bytes,
        )
        elided = self._elided(skeletons, thresholds, view_bytes, views)
        capped = _capped(effective.current_turn_result_tokens, skeletons, view_bytes, views)
        elided.update(capped)
        contents = self._log.record_contents(
            run_id, [s.sequence for s in skeletons if s.sequence not in elided]
        )
        surface = self._surfaces.resolve_turn(run_id)
        status = status_note(surface.servers, self._surfaces.server_states(run_id))
        sections = static_sections(spec)
        tail = dynamic_tail(surface.servers, host_tail)
        transient = transient_message(now, transient_note, status)
        openai_cache_key = cache_key(run.tenant, spec.name, spec.version)

        def build(guarded: Mapping[int, ToolResultView], end: int | None = None) -> AssembledPrompt:
            """The prompt over the log's first `end` records (all of them by default)."""
            entries = []
            for skeleton in skeletons[:end]:
                view = elided.get(skeleton.sequence) or guarded.get(skeleton.sequence)
                content = () if view is not None else contents.get(skeleton.sequence, ())
                if skeleton.kind is RecordKind.TOOL_RESULT and view is None:
                    content = tuple(model_view(content))
                    view = ToolResultView(
                        skeleton.call_id, skeleton.is_error, content, False, skeleton.handle
                    )
                entries.append(HistoryEntry(skeleton.kind, content, skeleton.tool_calls, view))
            prompt = Prompt(sections, tail, build_history(entries), transient, surface)
            return AssembledPrompt(
                prompt,
                zone_digests(prompt),
                anthropic_body(prompt, model, max_tokens),
                openai_body(prompt, model, max_tokens, openai_cache_key),
            )

        def finish(
            assembled: AssembledPrompt,
            guard: GuardDecision,
            guarded: Mapping[int, ToolResultView],
        ) -> AssembledPrompt:
            shown = {**elided, **guarded}
            saved = {
                sequence: max(0, view_bytes[sequence] - sum(len(p.data) for p in view.content))
                for sequence, view in shown.items()
            }
            assembled = replace(
                assembled,
                guard=guard,
                elided_results=len(shown),
                elided_bytes_saved=sum(saved.values()),
                guard_bytes_saved=sum(saved[sequence] for sequence in guarded),
                capped_results=len(capped),
                cap_bytes_saved=sum(saved[sequence] for sequence in capped),
            )
            if journal is not None:
                journal.record(
                    assembly_entry(
                        run_id=run_id,
                        time=datetime.now(UTC),
                        model=model,
                        spec_name=spec.name,
                        spec_version=spec.version,
                        # Sized as the model sees them, as the thresholds judged them.
                        skeletons=[
                            replace(s, content_bytes=view_bytes[s.sequence])
                            if s.sequence in view_bytes
                            else s
                            for s in skeletons
                        ],
                        digests=assembled.zones,
                        surface=surface,
                        elided={sequence: view.handle for sequence, view in shown.items()},
                        thresholds=thresholds,
                        context_guard=guard.reason or None,
                        guard_elided=set(guarded),
                        capped=set(capped),
                    )
                )
            return assembled

        in_full = build({})
        full = in_full.estimated_tokens
        budget = window - reserve
        if full <= budget:
            return finish(in_full, GuardDecision(window, reserve, full, full), {})
        # The context guard, the one place beyond the spec's letter (docs/prompt.md). It
        # replays its decision at each step of the turn so far (every assistant message of
        # the turn is where an earlier call ended), never returning a result to full: what an
        # earlier call sent elided stays elided, and what it sent in full is elided only when
        # the newer results cannot make room, so the previous call's prefix survives.
        current = [s for s in _current_results(skeletons) if s.sequence not in elided]
        views.prepare([s.sequence for s in current])
        elidable = [s for s in current if views.views[s.sequence] is not None]
        position = {s.sequence: index for index, s in enumerate(skeletons)}
        guarded: dict[int, ToolResultView] = {}
        chosen: list[GuardedResult] = []
        previous_end = 0
        assembled, estimate = in_full, full
        forced = False  # whether an earlier step of the turn had to elide an earlier result

        def elide(skeleton: RecordSkeleton) -> int:
            """Elide a current-turn result; the tokens its view saves."""
            view = views.views[skeleton.sequence]
            assert view is not None
            full_tokens = estimate_tokens(view_bytes[skeleton.sequence])
            view_tokens = estimate_text_tokens(view.content[0].as_text())
            guarded[skeleton.sequence] = view
            chosen.append(
                GuardedResult(skeleton.call_id, skeleton.handle, full_tokens, view_tokens)
            )
            return max(full_tokens - view_tokens, 0)

        for end in _step_ends(skeletons):
            attempt = in_full if end == len(skeletons) and not guarded else build(guarded, end)
            estimate = attempt.estimated_tokens
            if estimate <= budget:
                assembled, previous_end = attempt, end
                continue
            present = [
                s for s in elidable if position[s.sequence] < end and s.sequence not in guarded
            ]
            newer = [s for s in present if position[s.sequence] >= previous_end]
            earlier = [s for s in present if position[s.sequence] < previous_end]
            # Results added since the previous step first, largest first: the cached prefix
            # ends before them, so which one costs nothing.
            order = sorted(newer, key=lambda s: (-view_bytes[s.sequence], -s.sequence))
            while estimate > budget and order:
                projected = estimate
                while order and projected > budget:
                    projected -= elide(order.pop(0))
                attempt = build(guarded, end)
                estimate = attempt.estimated_tokens
            if estimate > budget and earlier:
                # Unavoidable: an earlier result the previous call sent in full must go, one
                # cache miss from the first one elided. The newest go first, so the miss
                # starts as late as it can, and until a tenth of the budget is free, so the
                # rest of the turn has room and the miss is not repeated at every step; if
                # the turn outgrows that room too, every earlier result goes at once.
                target = budget - budget // HEADROOM_DIVISOR if not forced else 0
                forced = True
                order = sorted(earlier, key=lambda s: -s.sequence)
                while estimate > target and order:
                    projected = estimate
                    while order and projected > target:
                        projected -= elide(order.pop(0))
                    attempt = build(guarded, end)
                    estimate = attempt.estimated_tokens
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
        guard = GuardDecision(window, reserve, estimate, full, tuple(chosen), reason)
        return finish(assembled, guard, guarded)

    def _view_bytes(self, run_id: str, skeletons: Sequence[RecordSkeleton]) -> dict[int, int]:
        """The UTF-8 bytes of each tool result as the model sees it in full: its content less
        a structured copy `model_view` leaves out. Sizes and thresholds are computed on this."""
        sizes: dict[int, int] = {}
        wanted = []
        for skeleton in skeletons:
            if skeleton.kind is not RecordKind.TOOL_RESULT:
                continue
            cached = self._view_sizes.get((run_id, skeleton.sequence))
            if cached is None:
                wanted.append(skeleton.sequence)
            else:
                sizes[skeleton.sequence] = cached
        if wanted:
            metas = self._log.part_metas(run_id, wanted)
            for sequence in wanted:
                size = sum(p.byte_length for p in model_view(metas.get(sequence, [])))
                sizes[sequence] = size
                self._view_sizes.put((run_id, sequence), size)
        return sizes

    def _elided(
        self,
        skeletons: Sequence[RecordSkeleton],
        thresholds: EffectiveThresholds,
        view_bytes: dict[int, int],
        views: _ElidedViews,
    ) -> dict[int, ToolResultView]:
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


def _budget(budget: ContextBudget) -> tuple[int, int | None]:
    window = budget.context_window_tokens
    return (DEFAULT_CONTEXT_WINDOW_TOKENS if window is None else window), (
        budget.output_reserve_tokens
    )


def _capped(
    cap: int | None,
    skeletons: Sequence[RecordSkeleton],
    view_bytes: Mapping[int, int],
    views: _ElidedViews,
) -> dict[int, ToolResultView]:
    """The current turn's results over the budget's optional cap, elided: a function of each
    result alone, so the same at every step of the turn."""
    if cap is None:
        return {}
    over = [
        s.sequence
        for s in _current_results(skeletons)
        if estimate_tokens(view_bytes[s.sequence]) > cap
    ]
    views.prepare(over)
    return {sequence: view for sequence in over if (view := views.views[sequence]) is not None}


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


def _current_results(skeletons: Sequence[RecordSkeleton]) -> list[RecordSkeleton]:
    """The tool results of the current turn: after the last user message (all of them when
    there is none)."""
    last_user = max(
        (i for i, s in enumerate(skeletons) if s.kind is RecordKind.USER_MESSAGE), default=-1
    )
    return [s for s in skeletons[last_user + 1 :] if s.kind is RecordKind.TOOL_RESULT]

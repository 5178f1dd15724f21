"""AssemblePrompt: the exact prompt for one model call, from the log, the Spec and the request.

Assembly work follows what is sent, not what is stored: turn boundaries, sizes and error
flags come from record metadata; an elided result contributes only the characters of its
preview (read as byte ranges of its parts), never its whole content.

The elision boundary is strictly before the last user message: results of earlier turns
are subject to elision, the current turn's go in full. A record's view therefore changes
at most once per turn (when the next user message arrives) and is byte-identical across the
steps of a turn, so the provider's cached prefix survives them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.errors import field_invalid
from psych_sidecar.domain.estimate import estimate_text_tokens, estimate_tokens
from psych_sidecar.domain.prompt.elision import (
    BatchResult,
    ViewPlan,
    first_step_candidates,
    plan_batch,
    plan_view,
)
from psych_sidecar.domain.prompt.journal import AssemblyJournal, assembly_entry
from psych_sidecar.domain.prompt.providers import anthropic_body, openai_body
from psych_sidecar.domain.prompt.zones import (
    HistoryEntry,
    Prompt,
    ToolResultView,
    ZoneDigest,
    build_history,
    static_sections,
    transient_message,
    zone_digests,
)
from psych_sidecar.domain.runlog import (
    ContentPart,
    EffectiveThresholds,
    LogReader,
    RecordKind,
    RecordSkeleton,
    RunService,
    SpecLookup,
    TextLayout,
    fetch_text,
)
from psych_sidecar.domain.surface import ToolSurface

DEFAULT_MAX_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class AssembledPrompt:
    prompt: Prompt
    zones: tuple[ZoneDigest, ...]
    anthropic_json: bytes
    openai_json: bytes
    # Prior-turn results sent elided, and the bytes their views left out (full size minus
    # what the view shows): for the operator's metrics.
    elided_results: int = 0
    elided_bytes_saved: int = 0


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
        log: LogReader,
        cache: ViewCache,
        run_id: str,
        thresholds: EffectiveThresholds,
        skeletons: dict[int, RecordSkeleton],
    ) -> None:
        self._log = log
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
            layout = TextLayout(metas.get(sequence, []))
            plan = plan_view(
                layout, skeleton.content_bytes, skeleton.is_error, skeleton.handle, self._thresholds
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
        runs: RunService,
        specs: SpecLookup,
        log: LogReader,
        surfaces: Callable[[str], ToolSurface],
        view_cache_size: int = 10_000,
        journal: AssemblyJournal | None = None,
    ) -> None:
        self._runs = runs
        self._specs = specs
        self._log = log
        # The Run's tool surface for this turn (TurnResolver.resolve_turn).
        self._surfaces = surfaces
        self._views = ViewCache(view_cache_size)
        # Told each prompt's metadata (never its content) after it is assembled.
        self._journal = journal

    def assemble(
        self,
        run_id: str,
        dynamic_tail: str,
        transient_note: str,
        now: datetime,
        model: str,
        max_tokens: int,
        journal: bool = True,
    ) -> AssembledPrompt:
        """The prompt for one model call; `journal=False` (a preview) leaves no journal row."""
        if max_tokens < 0:
            raise field_invalid("max_tokens", "must not be negative")
        run = self._runs.get(run_id)
        spec = self._specs.get(run.spec_name, run.spec_version)
        skeletons = self._log.record_skeletons(run_id)
        elided = self._elided(run_id, skeletons, spec.effective_thresholds())
        contents = self._log.record_contents(
            run_id, [s.sequence for s in skeletons if s.sequence not in elided]
        )
        entries = []
        for skeleton in skeletons:
            view = elided.get(skeleton.sequence)
            content = () if view is not None else contents.get(skeleton.sequence, ())
            if skeleton.kind is RecordKind.TOOL_RESULT and view is None:
                view = ToolResultView(
                    skeleton.call_id, skeleton.is_error, content, False, skeleton.handle
                )
            entries.append(HistoryEntry(skeleton.kind, content, skeleton.tool_calls, view))
        surface = self._surfaces(run_id)
        prompt = Prompt(
            static_sections=static_sections(spec, surface.servers),
            dynamic_tail=dynamic_tail,
            history=build_history(entries),
            transient=transient_message(now, transient_note),
            surface=surface,
        )
        max_tokens = max_tokens or DEFAULT_MAX_TOKENS
        by_sequence = {s.sequence: s for s in skeletons}
        saved = sum(
            max(0, by_sequence[sequence].content_bytes - sum(len(p.data) for p in view.content))
            for sequence, view in elided.items()
        )
        assembled = AssembledPrompt(
            prompt,
            zone_digests(prompt),
            anthropic_body(prompt, model, max_tokens),
            openai_body(prompt, model, max_tokens),
            elided_results=len(elided),
            elided_bytes_saved=saved,
        )
        if self._journal is not None and journal:
            self._journal.record(
                assembly_entry(
                    run_id=run_id,
                    time=datetime.now(UTC),
                    model=model,
                    spec_name=spec.name,
                    spec_version=spec.version,
                    skeletons=skeletons,
                    digests=assembled.zones,
                    surface=surface,
                    elided={sequence: view.handle for sequence, view in elided.items()},
                    thresholds=spec.effective_thresholds(),
                )
            )
        return assembled

    def _elided(
        self,
        run_id: str,
        skeletons: Sequence[RecordSkeleton],
        thresholds: EffectiveThresholds,
    ) -> dict[int, ToolResultView]:
        batches = [
            [BatchResult(s.sequence, estimate_tokens(s.content_bytes)) for s in batch]
            for batch in prior_batches(skeletons)
        ]
        views = _ElidedViews(
            log=self._log,
            cache=self._views,
            run_id=run_id,
            thresholds=thresholds,
            skeletons={s.sequence: s for s in skeletons},
        )
        views.prepare([s for batch in batches for s in first_step_candidates(batch, thresholds)])
        elided: dict[int, ToolResultView] = {}
        for batch in batches:
            for sequence in plan_batch(batch, thresholds, views.tokens):
                view = views.views[sequence]
                assert view is not None
                elided[sequence] = view
        return elided

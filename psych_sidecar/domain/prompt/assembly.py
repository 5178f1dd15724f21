"""AssemblePrompt: the exact prompt for one model call, from the log, the Spec and the request.

Assembly work follows what is sent, not what is stored: turn boundaries, sizes and error
flags come from record metadata; an elided result contributes only the characters of its
preview (read as byte ranges of its parts), never its whole content.

The elision boundary is strictly before the last user message: results of earlier turns
are subject to elision, the current turn's go in full. A record's view therefore changes
at most once per turn (when the next user message arrives) and is byte-identical across the
steps of a turn, so the provider's cached prefix survives them. The context guard
(:mod:`~psych_sidecar.domain.prompt.guard`) keeps that promise when it must elide current-turn
results to fit the budget; the elided views come from
:mod:`~psych_sidecar.domain.prompt.elided_views`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum

from psych_sidecar.domain.catalog import InputWaits
from psych_sidecar.domain.errors import ContextBudgetExceeded, field_invalid
from psych_sidecar.domain.estimate import estimate_tokens
from psych_sidecar.domain.prompt.compaction import (
    CompactionProposal,
    call_policy,
    choose_summary_call,
    compacted_log,
    kept_opening,
    opens_its_turn,
    range_end,
    summary_entry,
    summary_request,
    turn_at,
    with_advice,
)
from psych_sidecar.domain.prompt.elided_views import (
    ElidedViews,
    ViewCache,
    ViewSizeCache,
    capped_results,
    prior_turn_elided,
    view_sizes,
)
from psych_sidecar.domain.prompt.gemini import gemini_body
from psych_sidecar.domain.prompt.guard import GuardDecision, apply_context_guard
from psych_sidecar.domain.prompt.journal import assembly_entry
from psych_sidecar.domain.prompt.openai_responses import openai_responses_body
from psych_sidecar.domain.prompt.ports import AssemblyJournal, TurnSurfaces
from psych_sidecar.domain.prompt.prior_blocks import (
    BlockSizeCache,
    over_their_share,
    prior_block_sizes,
)
from psych_sidecar.domain.prompt.provider_compaction import (
    ProviderCompaction,
    anthropic_betas,
    is_compaction_block,
)
from psych_sidecar.domain.prompt.providers import anthropic_body, cache_key, openai_body
from psych_sidecar.domain.prompt.zones import (
    HistoryEntry,
    Prompt,
    PromptMessage,
    ToolResultView,
    ZoneDigest,
    build_history,
    dynamic_tail,
    static_sections,
    transient_message,
    waiting_note,
    zone_digests,
)
from psych_sidecar.domain.runlog import (
    DEFAULT_CONTEXT_WINDOW_TOKENS,
    CompactionPolicy,
    CompactionRange,
    ContextBudget,
    LogReader,
    PartKind,
    ReasoningSettings,
    RecordKind,
    RunService,
    SpecLookup,
    model_view,
    validate_call_reasoning,
    validate_context_budget,
    validate_provider_trigger,
)
from psych_sidecar.domain.surface import status_note

DEFAULT_MAX_TOKENS = 4096


class BodyFormat(StrEnum):
    """One of the provider request bodies AssemblePrompt builds."""

    ANTHROPIC_MESSAGES = "anthropic_messages"
    OPENAI_CHAT_COMPLETIONS = "openai_chat_completions"
    OPENAI_RESPONSES = "openai_responses"
    GEMINI_GENERATE_CONTENT = "gemini_generate_content"


ALL_BODIES = frozenset(BodyFormat)
# The bodies whose API compacts on its own side (CompactionBy.PROVIDER).
PROVIDER_COMPACTING_BODIES = frozenset({BodyFormat.ANTHROPIC_MESSAGES, BodyFormat.OPENAI_RESPONSES})


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
    # Overrides the Spec's reasoning settings field by field (ReasoningSettings.over).
    reasoning_override: ReasoningSettings | None = None
    # The bodies to build; the others are left empty (a host sends one).
    bodies: frozenset[BodyFormat] = ALL_BODIES
    # Overrides the Spec's compaction policy field by field (CompactionPolicy.over).
    compaction_override: CompactionPolicy | None = None


@dataclass(frozen=True, slots=True)
class AssembledPrompt:
    """One call's prompt, its per-zone sizes and hashes, the provider bodies (empty when the
    call did not ask for them) and the context guard's decision: everything an assembly
    journal needs to record."""

    prompt: Prompt
    zones: tuple[ZoneDigest, ...]
    anthropic_json: bytes
    openai_json: bytes
    openai_responses_json: bytes
    gemini_json: bytes
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
    # The compaction proposed, when one is due. When it is `required`, the call's own prompt
    # would not fit: the prompt and bodies above are then the summary call's.
    compaction: CompactionProposal | None = None
    # The anthropic-beta header values the Anthropic body needs (provider_compaction.py).
    anthropic_betas: tuple[str, ...] = ()

    @property
    def estimated_tokens(self) -> int:
        """The estimator over the largest body built: what the guard measures."""
        bodies = (self.anthropic_json, self.openai_json, self.openai_responses_json)
        return estimate_tokens(max(map(len, (*bodies, self.gemini_json))))


@dataclass(kw_only=True, slots=True, eq=False)
class PromptAssembler:
    runs: RunService
    specs: SpecLookup
    log: LogReader
    # The Run's tool surface for this turn (TurnResolver.resolve_turn).
    surfaces: TurnSurfaces
    view_cache_size: InitVar[int] = 10_000
    # Told each prompt's metadata (never its content) after it is assembled.
    journal: AssemblyJournal | None = None
    # The Run's calls waiting for their user's input, told in the transient message.
    waits: InputWaits | None = None
    _views: ViewCache = field(init=False)
    _view_sizes: ViewSizeCache = field(init=False)
    _block_sizes: BlockSizeCache = field(init=False)

    def __post_init__(self, view_cache_size: int) -> None:
        self._views = ViewCache(view_cache_size)
        self._view_sizes = ViewSizeCache(view_cache_size * 10)
        self._block_sizes = BlockSizeCache(view_cache_size * 10)

    def assemble(self, call: PromptCall) -> AssembledPrompt:
        """The prompt for one model call, told to the assembly journal."""
        return self._assemble(call, self.journal)

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
        run = self.runs.get(run_id)
        spec = self.specs.get(run.spec_name, run.spec_version)
        effective = spec.context_budget.over(budget_override or ContextBudget())
        window, reserve = _budget(effective)
        reserve = max_tokens if reserve is None else reserve
        if reserve >= window:
            raise field_invalid(
                "context_budget.output_reserve_tokens",
                f"the output reserve ({reserve} tokens) leaves no room in a context window "
                f"of {window} tokens",
            )
        reasoning = spec.reasoning.over(call.reasoning_override or ReasoningSettings())
        validate_call_reasoning(reasoning, max_tokens)
        policy = call_policy(spec.compaction, call.compaction_override, window - reserve)
        validate_provider_trigger(policy, window - reserve)
        provider_compaction = (
            ProviderCompaction(policy.trigger(window - reserve), policy.summary_instructions)
            if policy.by_provider
            else None
        )
        thresholds = spec.effective_thresholds()
        everything = self.log.record_skeletons(run_id)
        compacted = compacted_log(self.log, run_id, everything)
        # Zone 3 is the latest summary and the records after its range: every step below
        # works on those records only (prompt/compaction.py).
        skeletons = compacted.visible
        summary = summary_entry(compacted, policy.summary_tokens)
        view_bytes = view_sizes(self.log, self._view_sizes, run_id, skeletons)
        views = ElidedViews(
            log=self.log,
            cache=self._views,
            run_id=run_id,
            thresholds=thresholds,
            skeletons={s.sequence: s for s in skeletons},
            view_bytes=view_bytes,
        )
        elided = prior_turn_elided(skeletons, thresholds, view_bytes, views)
        capped = capped_results(effective.current_turn_result_tokens, skeletons, view_bytes, views)
        elided.update(capped)
        contents = self.log.record_contents(
            run_id, [s.sequence for s in skeletons if s.sequence not in elided]
        )
        prior_blocks = prior_block_sizes(self.log, self._block_sizes, run_id, skeletons)
        # The records whose provider blocks are left out (see prior_blocks.py); a list, so
        # that `build` sees the fallback below.
        left_out = [
            frozenset(prior_blocks)
            if over_their_share(prior_blocks, window - reserve)
            else frozenset()
        ]
        surface = self.surfaces.resolve_turn(run_id)
        status = status_note(surface.servers, self.surfaces.server_states(run_id))
        if self.waits is not None:
            # Which rounds still wait is a matter of the real clock, not the call's `now`.
            waiting = waiting_note(self.waits.waiting_in_run(run_id, datetime.now(UTC)))
            status = "\n".join(line for line in (status, waiting) if line)
        sections = static_sections(spec)
        tail = dynamic_tail(surface.servers, host_tail)
        transient = transient_message(now, transient_note, status)
        openai_cache_key = cache_key(run.tenant, spec.name, spec.version)
        wanted = call.bodies

        def build(
            guarded: Mapping[int, ToolResultView],
            end: int | None = None,
            closing: PromptMessage = transient,
        ) -> AssembledPrompt:
            """The prompt over the log's first `end` records (all of them by default), ending
            with `closing` (the transient message, or a compaction's summary request)."""
            entries = [] if summary is None else [summary]
            for skeleton in skeletons[:end]:
                view = elided.get(skeleton.sequence) or guarded.get(skeleton.sequence)
                content = () if view is not None else contents.get(skeleton.sequence, ())
                if skeleton.sequence in left_out[0]:
                    # A compaction block stays: it is what its provider's history starts with.
                    content = tuple(
                        p
                        for p in content
                        if p.kind is not PartKind.PROVIDER_BLOCK or is_compaction_block(p)
                    )
                if skeleton.kind is RecordKind.TOOL_RESULT and view is None:
                    content = tuple(model_view(content))
                    view = ToolResultView(
                        skeleton.call_id, skeleton.is_error, content, False, skeleton.handle
                    )
                entries.append(HistoryEntry(skeleton.kind, content, skeleton.tool_calls, view))
            prompt = Prompt(
                sections,
                tail,
                build_history(entries),
                closing,
                surface,
                spec.programmatic_calling,
                provider_compaction,
            )
            return AssembledPrompt(
                prompt,
                zone_digests(prompt),
                anthropic_body(prompt, model, max_tokens, reasoning)
                if BodyFormat.ANTHROPIC_MESSAGES in wanted
                else b"",
                openai_body(prompt, model, max_tokens, openai_cache_key, reasoning)
                if BodyFormat.OPENAI_CHAT_COMPLETIONS in wanted
                else b"",
                openai_responses_body(prompt, model, max_tokens, openai_cache_key, reasoning)
                if BodyFormat.OPENAI_RESPONSES in wanted
                else b"",
                gemini_body(prompt, max_tokens, reasoning)
                if BodyFormat.GEMINI_GENERATE_CONTENT in wanted
                else b"",
                anthropic_betas=anthropic_betas(prompt)
                if BodyFormat.ANTHROPIC_MESSAGES in wanted
                else (),
            )

        def guarded_build() -> tuple[AssembledPrompt, GuardDecision, dict[int, ToolResultView]]:
            return apply_context_guard(
                build,
                build({}),
                skeletons=skeletons,
                elided=elided,
                views=views,
                view_bytes=view_bytes,
                window=window,
                reserve=reserve,
            )

        def propose(
            estimate: int, guarded: Mapping[int, ToolResultView] | None
        ) -> CompactionProposal | None:
            """The compaction due, or None when there is nothing to compact. `guarded` is the
            guard's choice when the call fits (None when it does not)."""
            assert policy.enabled
            budget = window - reserve
            found = range_end(skeletons, policy.kept_turns)
            if found is None and guarded is None:
                # The prompt would not fit: every turn before the current one may go.
                found = range_end(skeletons, 0)
            if found is None:
                return None
            preferred: int = found
            first = 1 if compacted.covered is None else compacted.covered.last_sequence + 1

            def request(end: int, opening: str | None) -> PromptMessage:
                """The request for a summary through the record before `end`; `opening` is
                the first kept user message's text when the history goes on past the span
                (the would-be call's history), so the request can say where the span ends."""
                last = skeletons[end].sequence - 1
                return summary_request(policy, turn_at(compacted.turn_of, last), opening)

            kept_text = kept_opening(skeletons, preferred, contents)
            chosen = choose_summary_call(
                skeletons,
                preferred,
                budget,
                None
                if guarded is None
                else lambda: build(guarded, None, request(preferred, kept_text)),
                lambda cut: build({}, cut, request(cut, None)),
            )
            if chosen is None:
                return None
            end, bodies = chosen
            covered = CompactionRange(first, skeletons[end].sequence - 1)
            trigger = policy.trigger(budget)
            reason = (
                f"The prompt is about {estimate} tokens, over the compaction trigger of {trigger}"
                if guarded is not None
                else f"The prompt would not fit the budget of {budget} tokens"
            ) + f"; records {covered.first_sequence} to {covered.last_sequence} can be compacted."
            return CompactionProposal(
                covered=covered,
                first_turn=turn_at(compacted.turn_of, covered.first_sequence),
                last_turn=turn_at(compacted.turn_of, covered.last_sequence),
                anthropic_json=bodies.anthropic_json,
                openai_json=bodies.openai_json,
                openai_responses_json=bodies.openai_responses_json,
                gemini_json=bodies.gemini_json,
                estimated_tokens=estimate,
                trigger_tokens=trigger,
                summary_max_tokens=policy.summary_tokens,
                required=guarded is None,
                reason=reason,
                anthropic_betas=bodies.anthropic_betas,
            )

        try:
            try:
                assembled, guard, guarded = guarded_build()
            except ContextBudgetExceeded:
                if left_out[0] == frozenset(prior_blocks):
                    raise
                # Earlier turns' provider blocks go before the guard gives up (prior_blocks.py).
                left_out[0] = frozenset(prior_blocks)
                assembled, guard, guarded = guarded_build()
        except ContextBudgetExceeded as exceeded:
            required = propose(exceeded.full_estimated_tokens, None) if policy.enabled else None
            if required is None:
                raise with_advice(exceeded, policy) from None
            # Only the summary call can be made: the response carries no prompt of the call's
            # own, and nothing is journalled (no model call of the Run's was assembled).
            return replace(
                build({}, 0, PromptMessage(transient.role, ())),
                anthropic_json=b"",
                openai_json=b"",
                openai_responses_json=b"",
                gemini_json=b"",
                compaction=required,
            )
        estimate = assembled.estimated_tokens
        proposal = None
        # The provider compacts for the bodies that can, so a call that asks for those only
        # gets no proposal (one that would not fit still does, above).
        by_host = not (policy.by_provider and wanted <= PROVIDER_COMPACTING_BODIES)
        if (
            by_host
            and policy.enabled
            and opens_its_turn(skeletons)
            and estimate > policy.trigger(window - reserve)
        ):
            proposal = propose(estimate, guarded)
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
            compaction=proposal,
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
                        for s in everything
                    ],
                    digests=assembled.zones,
                    surface=surface,
                    elided={sequence: view.handle for sequence, view in shown.items()},
                    thresholds=thresholds,
                    context_guard=guard.reason or None,
                    guard_elided=set(guarded),
                    capped=set(capped),
                    compacted_through=0
                    if compacted.covered is None
                    else compacted.covered.last_sequence,
                )
            )
        return assembled


def _budget(budget: ContextBudget) -> tuple[int, int | None]:
    window = budget.context_window_tokens
    return (DEFAULT_CONTEXT_WINDOW_TOKENS if window is None else window), (
        budget.output_reserve_tokens
    )

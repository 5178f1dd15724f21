"""The assembly journal: one row of metadata per AssemblePrompt, for the Run inspector.

What the journal keeps is what explains a prompt's size and its cache behaviour: where in
the Run the call was (turn, step, the log's last sequence), each zone's size and digest, the
tool surface it used (connections, their states and catalogue versions), which prior-turn
results were elided and by which rule, the context guard's decision when there is one, and
how far the latest compaction reached.

What it never keeps is content: not the transient message (zone 4, which carries the clock
and the host's note), not the dynamic tail, not the bodies. They can be rebuilt from the
log, the Spec and the catalogue versions; the digests say whether a rebuild matches.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from psych_sidecar.domain.estimate import estimate_tokens
from psych_sidecar.domain.prompt.zones import Zone, ZoneDigest
from psych_sidecar.domain.runlog import EffectiveThresholds, RecordKind, RecordSkeleton
from psych_sidecar.domain.surface import ToolSurface


class ElisionRule(StrEnum):
    """Why a result was elided from a prompt."""

    # Step 2: the result alone is at or over the per-result threshold.
    PER_RESULT = "per_result"
    # Step 3: kept eliding the largest remaining results until the batch was under budget.
    PER_BATCH = "per_batch"
    # The context guard elided it so the prompt fits the model's window.
    CONTEXT_GUARD = "context_guard"
    # A current-turn result over the context budget's optional per-result cap.
    CURRENT_TURN_CAP = "current_turn_cap"


@dataclass(frozen=True, slots=True)
class ZoneSize:
    zone: Zone
    byte_length: int
    # Estimated with the one estimator (domain/estimate.py): a budget view, never billing.
    estimated_tokens: int
    sha256: str


@dataclass(frozen=True, slots=True)
class SurfaceServer:
    """One connection the call's tool surface showed, as it was then."""

    server: str
    state: str
    tier: str
    catalog_version: int
    permitted_tool_count: int


@dataclass(frozen=True, slots=True)
class ElidedResult:
    sequence: int
    handle: str
    rule: ElisionRule


@dataclass(frozen=True, slots=True)
class AssemblyEntry:
    """The metadata of one AssemblePrompt. `time` is the sidecar's clock when it assembled;
    `context_guard` is None when no guard decision was taken."""

    run_id: str
    time: datetime
    model: str
    spec_name: str
    spec_version: int
    # 1 for the first user message's turn; 0 before any user message.
    turn: int
    # 0 for a turn's first model call, then one more per assistant message in the turn.
    step: int
    # The log's last sequence the prompt was built from (0 for an empty log).
    last_sequence: int
    zones: tuple[ZoneSize, ...]
    tool_count: int
    servers: tuple[SurfaceServer, ...]
    elided: tuple[ElidedResult, ...]
    context_guard: str | None = None
    # The last record the latest compaction covered when the prompt was built (0: none):
    # zone 3 was its summary and the records after it.
    compacted_through: int = 0

    def zone(self, zone: Zone) -> ZoneSize:
        return next(z for z in self.zones if z.zone is zone)


def turn_and_step(skeletons: Sequence[RecordSkeleton]) -> tuple[int, int]:
    """The turn (user messages so far) and step (assistant messages since the last one)."""
    turn = step = 0
    for skeleton in skeletons:
        if skeleton.kind is RecordKind.USER_MESSAGE:
            turn += 1
            step = 0
        elif skeleton.kind is RecordKind.ASSISTANT_MESSAGE:
            step += 1
    return turn, step


def assembly_entry(
    *,
    run_id: str,
    time: datetime,
    model: str,
    spec_name: str,
    spec_version: int,
    skeletons: Sequence[RecordSkeleton],
    digests: Sequence[ZoneDigest],
    surface: ToolSurface,
    elided: Mapping[int, str],
    thresholds: EffectiveThresholds,
    context_guard: str | None = None,
    guard_elided: Collection[int] = (),
    capped: Collection[int] = (),
    compacted_through: int = 0,
) -> AssemblyEntry:
    """The entry for one assembled prompt. `elided` maps the sequences elided to their
    handles. Those in `guard_elided` were elided by the context guard, those in `capped` by
    the current-turn cap; for the others the
    rule follows from the algorithm: a result at or over the per-result threshold went in
    step 2, any other in step 3."""
    by_sequence = {s.sequence: s for s in skeletons}
    turn, step = turn_and_step(skeletons)
    rules = []
    for sequence in sorted(elided):
        skeleton = by_sequence.get(sequence)
        tokens = estimate_tokens(skeleton.content_bytes) if skeleton is not None else 0
        if sequence in guard_elided:
            rule = ElisionRule.CONTEXT_GUARD
        elif sequence in capped:
            rule = ElisionRule.CURRENT_TURN_CAP
        elif tokens >= thresholds.per_result_tokens:
            rule = ElisionRule.PER_RESULT
        else:
            rule = ElisionRule.PER_BATCH
        rules.append(ElidedResult(sequence, elided[sequence], rule))
    return AssemblyEntry(
        run_id=run_id,
        time=time,
        model=model,
        spec_name=spec_name,
        spec_version=spec_version,
        turn=turn,
        step=step,
        last_sequence=skeletons[-1].sequence if skeletons else 0,
        zones=tuple(
            ZoneSize(d.zone, d.byte_length, estimate_tokens(d.byte_length), d.sha256)
            for d in digests
        ),
        tool_count=len(surface.tools),
        servers=tuple(
            SurfaceServer(
                line.server,
                line.state.value,
                line.tier.value,
                line.catalog_version,
                line.permitted_tool_count,
            )
            for line in surface.servers
        ),
        elided=tuple(rules),
        context_guard=context_guard,
        compacted_through=compacted_through,
    )

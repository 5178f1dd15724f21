"""Why a model call's cached prefix missed: compare its journal entry with the previous call's.

The cacheable prefix is zones 1-3 in that order (zone 4, the transient message, is always new
and always after the last cache breakpoint). History normally grows by appending, which
keeps the prefix; it is rewritten only when elision changes (at the start of a turn, or by the
context guard). So a call misses from the first of:

1. zone 1 changed: the Spec's version, or the tools (a connection added or removed, a
   catalogue version moved, a tier changed; at most once per turn, the surface is pinned);
2. zone 2 changed: the tool-server roster (the same causes, for a server whose tools are not
   all in zone 1, such as a deferred one) or the host's dynamic tail;
3. the history was rewritten: a compaction (zone 3 now opens with its summary), results
   newly elided at the start of a turn, or, mid-turn, a result the previous call sent that
   the context guard now elides (or no longer does).
   The guard's decisions are compared, not its reason text, whose estimates move at every
   step; a result elided before the previous call ever sent it is no miss.

The bytes the miss cost are the current call's bytes from that zone through the history:
what the provider had to take at the full (or cache-write) rate again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from psych_sidecar.domain.estimate import estimate_tokens
from psych_sidecar.domain.prompt import AssemblyEntry, SurfaceServer, Zone

_PREFIX_ZONES = (Zone.STATIC_SYSTEM, Zone.DYNAMIC_TAIL, Zone.HISTORY)
UNREACHABLE = "unreachable"


class MissCause(StrEnum):
    SPEC_VERSION = "spec_version"
    CONNECTION_ADDED = "connection_added"
    CONNECTION_REMOVED = "connection_removed"
    CONNECTION_UNREACHABLE = "connection_unreachable"
    CONNECTION_STATE = "connection_state"
    CATALOG_VERSION = "catalog_version"
    TIER = "tier"
    SURFACE = "surface"
    DYNAMIC_TAIL = "dynamic_tail"
    ELISION = "elision"
    CONTEXT_GUARD = "context_guard"
    COMPACTION = "compaction"


@dataclass(frozen=True, slots=True)
class MissReason:
    """One reason a call's cached prefix missed: its cause and the sentence shown for it."""

    cause: MissCause
    text: str


@dataclass(frozen=True, slots=True)
class CacheMiss:
    first_zone: Zone
    reasons: tuple[MissReason, ...]
    # The current call's bytes from the first changed zone through the history.
    bytes_missed: int

    @property
    def tokens_missed(self) -> int:
        return estimate_tokens(self.bytes_missed)


def _surface_reasons(before: AssemblyEntry, after: AssemblyEntry) -> list[MissReason]:
    old: dict[str, SurfaceServer] = {s.server: s for s in before.servers}
    new: dict[str, SurfaceServer] = {s.server: s for s in after.servers}
    reasons = []
    for name in sorted(new.keys() - old.keys()):
        server = new[name]
        reasons.append(
            MissReason(
                MissCause.CONNECTION_ADDED,
                f"connection {name} added ({server.state}, catalogue v{server.catalog_version}, "
                f"{server.permitted_tool_count} tools, {server.tier})",
            )
        )
    for name in sorted(old.keys() - new.keys()):
        reasons.append(MissReason(MissCause.CONNECTION_REMOVED, f"connection {name} removed"))
    for name in sorted(old.keys() & new.keys()):
        was, now = old[name], new[name]
        if was.state != now.state:
            cause = (
                MissCause.CONNECTION_UNREACHABLE
                if now.state == UNREACHABLE
                else MissCause.CONNECTION_STATE
            )
            text = (
                f"connection {name} became unreachable"
                if now.state == UNREACHABLE
                else f"connection {name}: {was.state} → {now.state}"
            )
            reasons.append(MissReason(cause, text))
        if was.catalog_version != now.catalog_version:
            reasons.append(
                MissReason(
                    MissCause.CATALOG_VERSION,
                    f"connection {name}: catalogue v{was.catalog_version} → v{now.catalog_version}",
                )
            )
        if was.tier != now.tier:
            reasons.append(
                MissReason(MissCause.TIER, f"connection {name}: tier {was.tier} → {now.tier}")
            )
    return reasons


def explain_miss(before: AssemblyEntry | None, after: AssemblyEntry) -> CacheMiss | None:
    """Why `after` could not reuse `before`'s cached prefix; None when it could (or when
    there is no previous call: a cold start is not a miss to explain)."""
    if before is None:
        return None
    reasons: list[MissReason] = []
    first: Zone | None = None
    if before.zone(Zone.STATIC_SYSTEM).sha256 != after.zone(Zone.STATIC_SYSTEM).sha256:
        first = Zone.STATIC_SYSTEM
        if before.spec_version != after.spec_version or before.spec_name != after.spec_name:
            reasons.append(
                MissReason(
                    MissCause.SPEC_VERSION,
                    f"Spec {before.spec_name} v{before.spec_version} → "
                    f"{after.spec_name} v{after.spec_version}",
                )
            )
        reasons.extend(_surface_reasons(before, after))
        if not reasons:
            reasons.append(
                MissReason(MissCause.SURFACE, "the tool surface changed (tools or server lines)")
            )
    if before.zone(Zone.DYNAMIC_TAIL).sha256 != after.zone(Zone.DYNAMIC_TAIL).sha256:
        # Zone 2 holds the tool-server roster, then the host's tail.
        roster = []
        if first is None:
            states = (MissCause.CONNECTION_UNREACHABLE, MissCause.CONNECTION_STATE)
            roster = [r for r in _surface_reasons(before, after) if r.cause not in states]
        first = first or Zone.DYNAMIC_TAIL
        reasons.extend(roster)
        if not roster:
            reasons.append(MissReason(MissCause.DYNAMIC_TAIL, "the dynamic tail changed"))
    # Decisions, not their wording: the guard's reason text carries estimates that move at
    # every step, but only a view that changed in bytes the previous call sent is a miss.
    if after.compacted_through != before.compacted_through:
        first = first or Zone.HISTORY
        reasons.append(
            MissReason(
                MissCause.COMPACTION,
                f"compaction: records up to #{after.compacted_through} are now a summary "
                f"(before: up to #{before.compacted_through})"
                if before.compacted_through
                else f"compaction: records 1 to #{after.compacted_through} are now a summary",
            )
        )
    # Results a compaction took out of zone 3 are neither elided nor restored: gone from it.
    was = {e.sequence: e for e in before.elided if e.sequence > after.compacted_through}
    now = {e.sequence for e in after.elided}
    newly = [e for e in after.elided if e.sequence not in was]
    restored = [e for sequence, e in sorted(was.items()) if sequence not in now]
    if after.turn == before.turn:
        # Mid-turn only the context guard elides; results the previous call never sent
        # (newer than its log) change nothing it cached.
        rewritten = [e for e in newly if e.sequence <= before.last_sequence]
        for changed, what in (
            (rewritten, "elided after an earlier call of the turn sent it in full"),
            (restored, "back in full after an earlier call of the turn sent it elided"),
        ):
            if changed:
                first = first or Zone.HISTORY
                listed = ", ".join(f"#{e.sequence}" for e in changed)
                reasons.append(
                    MissReason(
                        MissCause.CONTEXT_GUARD,
                        f"context guard mid-turn (turn {after.turn}, step {after.step}): "
                        f"{listed} {what}",
                    )
                )
    elif newly or restored:
        first = first or Zone.HISTORY
        listed = ", ".join(f"#{e.sequence} ({e.rule.value})" for e in newly)
        text = f"elision at the start of turn {after.turn}: {listed} elided" if newly else ""
        if restored:
            back = ", ".join(f"#{e.sequence}" for e in restored)
            text = (
                f"{text}; {back} back in full"
                if text
                else (f"elision at the start of turn {after.turn}: {back} back in full")
            )
        reasons.append(MissReason(MissCause.ELISION, text))
    if first is None:
        return None
    cost = sum(after.zone(z).byte_length for z in _PREFIX_ZONES if z >= first)
    return CacheMiss(first, tuple(reasons), cost)

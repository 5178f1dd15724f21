"""A Spec's compaction policy: when AssemblePrompt proposes compacting a Run's history, how
many recent turns stay verbatim, and what the summary call asks for (docs/prompt.md,
"Compaction"). Overridable per call field by field, like the context budget."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from psych_sidecar.domain.errors import field_invalid, field_required

DEFAULT_KEEP_RECENT_TURNS = 2
DEFAULT_SUMMARY_MAX_TOKENS = 2_000
DEFAULT_SUMMARY_INSTRUCTIONS = (
    "Keep what the rest of the conversation needs: the user's goals and constraints, "
    "decisions made and why, facts learned (names, numbers, identifiers, tool result "
    "handles worth reading again), work done and work still open."
)
MAX_SUMMARY_INSTRUCTIONS_CHARS = 8_000
MAX_KEEP_RECENT_TURNS = 10_000


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When and how AssemblePrompt proposes compacting the history; None takes the default.
    Compaction is on when a trigger is set: `trigger_tokens`, or `trigger_fraction` of the
    context budget (the window less the output reserve), never both."""

    trigger_tokens: int | None = None
    trigger_fraction: float | None = None
    keep_recent_turns: int | None = None
    summary_instructions: str | None = None
    summary_max_tokens: int | None = None

    @property
    def enabled(self) -> bool:
        return self.trigger_tokens is not None or self.trigger_fraction is not None

    def over(self, override: CompactionPolicy) -> CompactionPolicy:
        """This policy with the fields `override` sets replaced; setting either trigger
        replaces both (a policy has one trigger)."""
        triggers = (
            (override.trigger_tokens, override.trigger_fraction)
            if override.enabled
            else (self.trigger_tokens, self.trigger_fraction)
        )

        def pick(mine: Any, theirs: Any) -> Any:
            return theirs if theirs is not None else mine

        return CompactionPolicy(
            *triggers,
            keep_recent_turns=pick(self.keep_recent_turns, override.keep_recent_turns),
            summary_instructions=pick(self.summary_instructions, override.summary_instructions),
            summary_max_tokens=pick(self.summary_max_tokens, override.summary_max_tokens),
        )

    def trigger(self, budget_tokens: int) -> int:
        """The estimate over which compaction is due, never above the budget."""
        if self.trigger_tokens is not None:
            return min(self.trigger_tokens, budget_tokens)
        assert self.trigger_fraction is not None
        return max(1, min(int(self.trigger_fraction * budget_tokens), budget_tokens))

    @property
    def kept_turns(self) -> int:
        kept = self.keep_recent_turns
        return DEFAULT_KEEP_RECENT_TURNS if kept is None else kept

    @property
    def summary_tokens(self) -> int:
        cap = self.summary_max_tokens
        return DEFAULT_SUMMARY_MAX_TOKENS if cap is None else cap

    @property
    def instructions(self) -> str:
        text = self.summary_instructions
        return DEFAULT_SUMMARY_INSTRUCTIONS if text is None else text

    def content(self) -> dict[str, Any]:
        """The fields set, for the Spec's stored JSON."""
        return {key: value for key, value in asdict(self).items() if value is not None}


def validate_compaction(policy: CompactionPolicy, field_path: str) -> None:
    """Refuse values no call could use (an override may set any of them alone)."""
    if policy.trigger_tokens is not None and policy.trigger_fraction is not None:
        raise field_invalid(
            f"{field_path}.trigger_fraction", "set one trigger, trigger_tokens or this, not both"
        )
    if policy.trigger_tokens is not None and policy.trigger_tokens <= 0:
        raise field_invalid(f"{field_path}.trigger_tokens", "must be greater than 0")
    fraction = policy.trigger_fraction
    if fraction is not None and not 0 < fraction <= 1:
        raise field_invalid(
            f"{field_path}.trigger_fraction", "must be greater than 0 and at most 1"
        )
    kept = policy.keep_recent_turns
    if kept is not None and not 0 <= kept <= MAX_KEEP_RECENT_TURNS:
        raise field_invalid(
            f"{field_path}.keep_recent_turns", f"must be from 0 to {MAX_KEEP_RECENT_TURNS}"
        )
    text = policy.summary_instructions
    if text is not None and (len(text) > MAX_SUMMARY_INSTRUCTIONS_CHARS or "\x00" in text):
        raise field_invalid(
            f"{field_path}.summary_instructions",
            f"at most {MAX_SUMMARY_INSTRUCTIONS_CHARS} characters, without NUL",
        )
    if policy.summary_max_tokens is not None and policy.summary_max_tokens <= 0:
        raise field_invalid(f"{field_path}.summary_max_tokens", "must be greater than 0")


def require_trigger(policy: CompactionPolicy, field_path: str) -> None:
    """A whole policy (a Spec's) that sets anything sets a trigger: the rest means nothing
    without one."""
    if not policy.enabled and policy != CompactionPolicy():
        raise field_required(f"{field_path}.trigger_tokens")

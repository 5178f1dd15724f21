"""A Spec's compaction policy: when AssemblePrompt proposes compacting a Run's history, how
many recent turns stay verbatim, and what the summary call asks for (docs/prompt.md,
"Compaction"). Overridable per call field by field, like the context budget."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
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
# Anthropic's floor for the compaction edit's trigger ("must be at least 50,000 tokens").
MIN_ANTHROPIC_COMPACTION_TRIGGER = 50_000


class CompactionBy(StrEnum):
    """Who compacts: the host on the sidecar's proposal (every body), or the provider in the
    bodies whose API compacts (Anthropic Messages, OpenAI Responses; docs/prompt.md)."""

    HOST = "host"
    PROVIDER = "provider"


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
    compaction_by: CompactionBy | None = None

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
            compaction_by=pick(self.compaction_by, override.compaction_by),
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

    @property
    def by_provider(self) -> bool:
        """Whether the provider compacts in the bodies whose API can (on, with a trigger)."""
        return self.enabled and self.compaction_by is CompactionBy.PROVIDER

    def content(self) -> dict[str, Any]:
        """The fields set, for the Spec's stored JSON (who compacts by its value)."""
        return {
            key: value.value if isinstance(value, CompactionBy) else value
            for key, value in asdict(self).items()
            if value is not None
        }

    @classmethod
    def from_content(cls, data: dict[str, Any]) -> CompactionPolicy:
        by = data.get("compaction_by")
        return cls(**{**data, "compaction_by": None if by is None else CompactionBy(by)})


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
    if policy.compaction_by is CompactionBy.PROVIDER and policy.trigger_tokens is not None:
        _check_provider_trigger(policy.trigger_tokens, f"{field_path}.trigger_tokens")


def validate_provider_trigger(policy: CompactionPolicy, budget_tokens: int) -> None:
    """At the call: the provider's trigger (the policy's, as the budget makes it) is one
    Anthropic takes."""
    if policy.by_provider:
        name = "trigger_tokens" if policy.trigger_tokens is not None else "trigger_fraction"
        _check_provider_trigger(policy.trigger(budget_tokens), f"compaction.{name}")


def _check_provider_trigger(trigger: int, field_path: str) -> None:
    if trigger < MIN_ANTHROPIC_COMPACTION_TRIGGER:
        raise field_invalid(
            field_path,
            f"the provider's compaction needs a trigger of at least "
            f"{MIN_ANTHROPIC_COMPACTION_TRIGGER} tokens (Anthropic's floor); this one is "
            f"{trigger}",
        )


def require_trigger(policy: CompactionPolicy, field_path: str) -> None:
    """A whole policy (a Spec's) that sets anything sets a trigger: the rest means nothing
    without one."""
    if not policy.enabled and policy != CompactionPolicy():
        raise field_required(f"{field_path}.trigger_tokens")

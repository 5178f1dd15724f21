"""A reasoning model's parameters, per provider: set on the Spec, overridable per call, and
checked so that no combination a provider refuses ever reaches a request body.

The rules checked, each the provider's own (docs/prompt.md cites them): Anthropic's enabled
thinking needs `budget_tokens`, at least 1024 and below `max_tokens`, and a budget goes with
enabled thinking only; Gemini takes a thinking budget (-1 for dynamic, else 0 to 32768) or a
thinking level, never both in one request.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from psych_sidecar.domain.errors import field_invalid, field_required

MIN_ANTHROPIC_BUDGET_TOKENS = 1024
MAX_GEMINI_THINKING_BUDGET = 32768
DYNAMIC_GEMINI_THINKING_BUDGET = -1


class AnthropicThinking(StrEnum):
    ENABLED = "enabled"
    ADAPTIVE = "adaptive"
    DISABLED = "disabled"


class ReasoningEffort(StrEnum):
    NONE = "none"
    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"


class GeminiThinkingLevel(StrEnum):
    MINIMAL = "MINIMAL"
    LOW = "LOW"
    MEDIUM = "MEDIUM"
    HIGH = "HIGH"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasoningSettings:
    """Each provider's thinking parameters; None leaves a parameter out of the body."""

    anthropic_thinking: AnthropicThinking | None = None
    anthropic_budget_tokens: int | None = None
    openai_reasoning_effort: ReasoningEffort | None = None
    gemini_thinking_budget: int | None = None
    gemini_thinking_level: GeminiThinkingLevel | None = None
    gemini_include_thoughts: bool | None = None

    def over(self, override: ReasoningSettings) -> ReasoningSettings:
        """These settings with the fields `override` sets replaced. Setting one of an
        exclusive pair drops this side's other: a per-call adaptive thinking drops the
        Spec's budget, a per-call Gemini level the Spec's Gemini budget, and so on."""
        base = self
        if override.anthropic_thinking is not None and override.anthropic_budget_tokens is None:
            base = replace(base, anthropic_budget_tokens=None)
        if override.gemini_thinking_level is not None:
            base = replace(base, gemini_thinking_budget=None)
        if override.gemini_thinking_budget is not None:
            base = replace(base, gemini_thinking_level=None)
        changes = {k: v for k, v in asdict(override).items() if v is not None}
        return replace(base, **changes)

    def content(self) -> dict[str, Any]:
        """The fields set, for the Spec's stored JSON."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_content(cls, data: dict[str, Any]) -> ReasoningSettings:
        def read(key: str, kind: Any) -> Any:
            value = data.get(key)
            return None if value is None else kind(value)

        return cls(
            anthropic_thinking=read("anthropic_thinking", AnthropicThinking),
            anthropic_budget_tokens=data.get("anthropic_budget_tokens"),
            openai_reasoning_effort=read("openai_reasoning_effort", ReasoningEffort),
            gemini_thinking_budget=data.get("gemini_thinking_budget"),
            gemini_thinking_level=read("gemini_thinking_level", GeminiThinkingLevel),
            gemini_include_thoughts=data.get("gemini_include_thoughts"),
        )


def validate_reasoning(settings: ReasoningSettings, field_path: str) -> None:
    """Refuse settings no request could carry (at publish, and per call after the merge)."""
    thinking, budget = settings.anthropic_thinking, settings.anthropic_budget_tokens
    if thinking is AnthropicThinking.ENABLED and budget is None:
        raise field_required(f"{field_path}.anthropic_budget_tokens")
    if budget is not None and thinking is not AnthropicThinking.ENABLED:
        raise field_invalid(
            f"{field_path}.anthropic_budget_tokens", "applies only to enabled thinking"
        )
    if budget is not None and budget < MIN_ANTHROPIC_BUDGET_TOKENS:
        raise field_invalid(
            f"{field_path}.anthropic_budget_tokens",
            f"must be at least {MIN_ANTHROPIC_BUDGET_TOKENS}",
        )
    gemini = settings.gemini_thinking_budget
    if gemini is not None and not (
        gemini == DYNAMIC_GEMINI_THINKING_BUDGET or 0 <= gemini <= MAX_GEMINI_THINKING_BUDGET
    ):
        raise field_invalid(
            f"{field_path}.gemini_thinking_budget",
            f"must be -1 (dynamic) or 0 to {MAX_GEMINI_THINKING_BUDGET}",
        )
    if gemini is not None and settings.gemini_thinking_level is not None:
        raise field_invalid(
            f"{field_path}.gemini_thinking_level",
            "Gemini takes a thinking budget or a thinking level, not both",
        )


def validate_call_reasoning(settings: ReasoningSettings, max_tokens: int) -> None:
    """The call's settings (after the merge) with the call's max_tokens."""
    validate_reasoning(settings, "reasoning")
    budget = settings.anthropic_budget_tokens
    if budget is not None and budget >= max_tokens:
        raise field_invalid(
            "max_tokens",
            f"must be greater than the Anthropic thinking budget ({budget} tokens)",
        )

"""ReasoningSettings between protobuf and the domain. No logic beyond the translation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from psych.sidecar.v1 import spec_pb2
from psych_sidecar.domain.errors import field_invalid
from psych_sidecar.domain.runlog import (
    AnthropicThinking,
    GeminiThinkingLevel,
    ReasoningEffort,
    ReasoningSettings,
)

T = TypeVar("T")

_THINKING = {
    spec_pb2.ANTHROPIC_THINKING_ENABLED: AnthropicThinking.ENABLED,
    spec_pb2.ANTHROPIC_THINKING_ADAPTIVE: AnthropicThinking.ADAPTIVE,
    spec_pb2.ANTHROPIC_THINKING_DISABLED: AnthropicThinking.DISABLED,
}
_EFFORT = {
    spec_pb2.REASONING_EFFORT_NONE: ReasoningEffort.NONE,
    spec_pb2.REASONING_EFFORT_MINIMAL: ReasoningEffort.MINIMAL,
    spec_pb2.REASONING_EFFORT_LOW: ReasoningEffort.LOW,
    spec_pb2.REASONING_EFFORT_MEDIUM: ReasoningEffort.MEDIUM,
    spec_pb2.REASONING_EFFORT_HIGH: ReasoningEffort.HIGH,
    spec_pb2.REASONING_EFFORT_XHIGH: ReasoningEffort.XHIGH,
}
_LEVEL = {
    spec_pb2.GEMINI_THINKING_LEVEL_MINIMAL: GeminiThinkingLevel.MINIMAL,
    spec_pb2.GEMINI_THINKING_LEVEL_LOW: GeminiThinkingLevel.LOW,
    spec_pb2.GEMINI_THINKING_LEVEL_MEDIUM: GeminiThinkingLevel.MEDIUM,
    spec_pb2.GEMINI_THINKING_LEVEL_HIGH: GeminiThinkingLevel.HIGH,
}


def _enum(table: Mapping[Any, T], value: int, field_path: str) -> T | None:
    if value == 0:
        return None
    if value not in table:
        raise field_invalid(field_path, f"unknown value {value}")
    return table[value]


def reasoning_from_proto(message: spec_pb2.ReasoningSettings, field_path: str) -> ReasoningSettings:
    return ReasoningSettings(
        anthropic_thinking=_enum(
            _THINKING, message.anthropic_thinking, f"{field_path}.anthropic_thinking"
        ),
        anthropic_budget_tokens=message.anthropic_budget_tokens
        if message.HasField("anthropic_budget_tokens")
        else None,
        openai_reasoning_effort=_enum(
            _EFFORT, message.openai_reasoning_effort, f"{field_path}.openai_reasoning_effort"
        ),
        gemini_thinking_budget=message.gemini_thinking_budget
        if message.HasField("gemini_thinking_budget")
        else None,
        gemini_thinking_level=_enum(
            _LEVEL, message.gemini_thinking_level, f"{field_path}.gemini_thinking_level"
        ),
        gemini_include_thoughts=message.gemini_include_thoughts
        if message.HasField("gemini_include_thoughts")
        else None,
    )


def _key(table: Mapping[Any, T], value: T | None) -> Any:
    return 0 if value is None else next(k for k, v in table.items() if v == value)


def reasoning_to_proto(settings: ReasoningSettings) -> spec_pb2.ReasoningSettings:
    return spec_pb2.ReasoningSettings(
        anthropic_thinking=_key(_THINKING, settings.anthropic_thinking),
        anthropic_budget_tokens=settings.anthropic_budget_tokens,
        openai_reasoning_effort=_key(_EFFORT, settings.openai_reasoning_effort),
        gemini_thinking_budget=settings.gemini_thinking_budget,
        gemini_thinking_level=_key(_LEVEL, settings.gemini_thinking_level),
        gemini_include_thoughts=settings.gemini_include_thoughts,
    )

"""The prompt of one model call: four cache zones, elision, provider bodies.

Owns AssemblePrompt (:class:`PromptAssembler`): zones ordered outermost-stable first, the
prior-turn elision boundary and algorithm (previews, failure truncation), canonical JSON for
byte-stable output, and the Anthropic and OpenAI request bodies.
"""

from __future__ import annotations

from psych_sidecar.domain.prompt.assembly import (
    AssembledPrompt,
    GuardDecision,
    GuardedResult,
    PromptAssembler,
    SpecLookup,
    TurnSurfaces,
)
from psych_sidecar.domain.prompt.zones import Prompt, PromptMessage, Role, ToolResultView, Zone

__all__ = [
    "AssembledPrompt",
    "GuardDecision",
    "GuardedResult",
    "Prompt",
    "PromptAssembler",
    "PromptMessage",
    "Role",
    "SpecLookup",
    "ToolResultView",
    "TurnSurfaces",
    "Zone",
]

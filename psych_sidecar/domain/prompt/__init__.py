"""The prompt of one model call: four cache zones, elision, provider bodies.

Owns AssemblePrompt (:class:`PromptAssembler`): zones ordered outermost-stable first, the
prior-turn elision boundary and algorithm (previews, failure truncation), the context guard
that elides current-turn results to fit the budget, canonical JSON for byte-stable output,
the request bodies (Anthropic Messages, OpenAI Chat Completions and Responses, Gemini) with
each provider's own blocks put back, compaction (zone 3 as the latest summary and what
follows it, and the proposal of the next one), and the assembly journal's entry for each prompt
(metadata only; storage implements :class:`AssemblyJournal`).
"""

from __future__ import annotations

from psych_sidecar.domain.prompt.assembly import (
    ALL_BODIES,
    AssembledPrompt,
    BodyFormat,
    PromptAssembler,
    PromptCall,
)
from psych_sidecar.domain.prompt.compaction import CompactionProposal
from psych_sidecar.domain.prompt.guard import GuardDecision, GuardedResult
from psych_sidecar.domain.prompt.journal import (
    AssemblyEntry,
    ElidedResult,
    ElisionRule,
    SurfaceServer,
    ZoneSize,
)
from psych_sidecar.domain.prompt.ports import AssemblyJournal, TurnSurfaces
from psych_sidecar.domain.prompt.zones import Prompt, PromptMessage, Role, ToolResultView, Zone

__all__ = [
    "ALL_BODIES",
    "AssembledPrompt",
    "AssemblyEntry",
    "AssemblyJournal",
    "BodyFormat",
    "CompactionProposal",
    "ElidedResult",
    "ElisionRule",
    "GuardDecision",
    "GuardedResult",
    "Prompt",
    "PromptAssembler",
    "PromptCall",
    "PromptMessage",
    "Role",
    "SurfaceServer",
    "ToolResultView",
    "TurnSurfaces",
    "Zone",
    "ZoneSize",
]

"""The provider's own compaction, for the bodies whose API has one (docs/prompt.md, "The
provider's own compaction").

With `CompactionPolicy.compaction_by` PROVIDER, the Anthropic Messages body carries the
`compact_20260112` context-management edit and the OpenAI Responses body a `compaction`
context-management entry, both at the policy's trigger. The provider then compacts on its
side and returns an opaque block (Anthropic's `compaction` content block, OpenAI's
`compaction` output item), which the host appends as a provider block of type `compaction`
of the assistant message it came in. From the next call on, that provider's body starts its
history at the latest such block, byte-exact, and drops what came before it, as the
provider itself does on receipt: Anthropic "drops all message blocks prior to the
compaction block", OpenAI lets the caller drop the items before the latest compaction
item. Zones 1 and 2 (tools, system, instructions, the developer message) are not history
and stay. Other providers' bodies never see those blocks (they are another provider's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from psych_sidecar.domain.runlog import ContentPart, PartKind, Provider

if TYPE_CHECKING:
    from psych_sidecar.domain.prompt.zones import Prompt, PromptMessage

# The provider block type both APIs give their compaction block or item.
COMPACTION_BLOCK = "compaction"
# Anthropic's compaction edit, and the beta header value it needs (on the request that
# carries the edit and on every one that sends a compaction block back).
ANTHROPIC_COMPACTION_EDIT = "compact_20260112"
ANTHROPIC_COMPACTION_BETA = "compact-2026-01-12"


@dataclass(frozen=True, slots=True)
class ProviderCompaction:
    """What the bodies ask of the provider's compaction: the trigger (the policy's, in
    estimated tokens) and the policy's own summary instructions, when it set them."""

    trigger_tokens: int
    instructions: str | None = None

    def anthropic_context_management(self) -> dict[str, Any]:
        """The Messages API's `context_management`: the compaction edit at the trigger
        (`instructions`, when given, replace Anthropic's summarisation prompt)."""
        edit: dict[str, Any] = {
            "type": ANTHROPIC_COMPACTION_EDIT,
            "trigger": {"type": "input_tokens", "value": self.trigger_tokens},
        }
        if self.instructions is not None:
            edit["instructions"] = self.instructions
        return {"edits": [edit]}

    def openai_context_management(self) -> list[dict[str, Any]]:
        """The Responses API's `context_management`: one compaction entry at the trigger."""
        return [{"type": COMPACTION_BLOCK, "compact_threshold": self.trigger_tokens}]


def is_compaction_block(part: object, provider: Provider | None = None) -> bool:
    """Whether `part` is a provider's compaction block (of `provider`, when given)."""
    if not isinstance(part, ContentPart) or part.kind is not PartKind.PROVIDER_BLOCK:
        return False
    envelope = part.envelope
    if envelope.block_type != COMPACTION_BLOCK:
        return False
    return provider is None or envelope.provider is provider


def since_compaction(
    history: Sequence[PromptMessage], provider: Provider
) -> Sequence[PromptMessage]:
    """The history `provider`'s body sends: from its latest compaction block on (the
    assistant message holding it, without the content before the block), or all of it when
    there is none. The message's tool calls stay: they follow its content."""
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        positions = [
            i for i, part in enumerate(message.parts) if is_compaction_block(part, provider)
        ]
        if not positions:
            continue
        start = positions[-1]
        parts = tuple(
            part
            for i, part in enumerate(message.parts)
            if i >= start or not isinstance(part, ContentPart)
        )
        return (replace(message, parts=parts), *history[index + 1 :])
    return history


def anthropic_betas(prompt: Prompt) -> tuple[str, ...]:
    """The anthropic-beta values the prompt's Anthropic body needs: compaction's when it
    carries the edit or sends a compaction block back."""
    has_block = any(
        is_compaction_block(part, Provider.ANTHROPIC)
        for message in prompt.history
        for part in message.parts
    )
    if prompt.provider_compaction is not None or has_block:
        return (ANTHROPIC_COMPACTION_BETA,)
    return ()

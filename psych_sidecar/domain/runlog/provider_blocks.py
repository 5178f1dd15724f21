"""Provider blocks: one model API's own response block, kept in the log byte for byte.

A reasoning model's API needs some of its response back exactly as it sent it: Anthropic's
thinking and redacted_thinking blocks (signature included), OpenAI's reasoning items
(encrypted_content included), Gemini's parts carrying a thoughtSignature. The log stores such a
block as a content part of the assistant message it came in, with an envelope saying which
provider sent it, the block's type, and (when the block is the provider's own spelling of one
of the message's tool calls) that call's id. The block itself is untrusted and opaque: checked
only to be one JSON object of bounded size, never read inside, never altered, never logged.

The envelope is stored in the part's `mime_type` column as a JSON array
`[provider, type, call_id]`, so the log's schema needs no new column.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

# A block is at most this many bytes: above the largest thinking block a 128k-token budget
# yields (about 0.5 MB of text) with its signature, far below what would strain a request.
MAX_PROVIDER_BLOCK_BYTES = 4 * 1024 * 1024


class Provider(StrEnum):
    ANTHROPIC = "anthropic"  # the Messages API
    OPENAI = "openai"  # the Responses API
    GEMINI = "gemini"  # generateContent


@dataclass(frozen=True, slots=True)
class BlockEnvelope:
    """What the sidecar knows of a provider block: who sent it, its type, the tool call it
    spells (empty: none)."""

    provider: Provider
    block_type: str
    call_id: str = ""

    def encode(self) -> str:
        """The envelope as stored (the part's `mime_type` column)."""
        return json.dumps(
            [self.provider.value, self.block_type, self.call_id],
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @staticmethod
    def decode(stored: str) -> BlockEnvelope:
        return _decode(stored)


@lru_cache(maxsize=4096)
def _decode(stored: str) -> BlockEnvelope:
    provider, block_type, call_id = json.loads(stored)
    return BlockEnvelope(Provider(provider), block_type, call_id)

"""The one token estimator: cheap and monotone in size, for prompt-budget decisions only.

A threshold trigger needs to be fast and monotone, not accurate: appending content never
lowers the estimate. It is a function of UTF-8 byte counts, so it runs on the sizes stored
with each record without loading content. Metering must never use it (an import-linter
contract in pyproject.toml keeps the usage modules from reaching this module).
"""

from __future__ import annotations

BYTES_PER_TOKEN = 4


def estimate_tokens(byte_count: int) -> int:
    """Estimated tokens for content of `byte_count` bytes: ceil(bytes / 4)."""
    return -(-byte_count // BYTES_PER_TOKEN)


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens for text, by its UTF-8 length (ASCII text skips the encoding)."""
    return estimate_tokens(len(text) if text.isascii() else len(text.encode()))

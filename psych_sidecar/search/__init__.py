"""Tool search: keyword ranking (BM25F) fused with sentence embeddings, glosses of Chinese
descriptions, and the sentence encoder with its background warm-up.

Layers inside: :mod:`~psych_sidecar.search.ranking` and :mod:`~psych_sidecar.search.gloss` are
pure (the domain imports ranking directly); :mod:`~psych_sidecar.search.embeddings` owns the
vector cache and the warm-up thread; :mod:`~psych_sidecar.search.encoder` runs the model
(numpy), loaded only when semantic search is on.
"""

from __future__ import annotations

from psych_sidecar.search.embeddings import TextEncoder, ToolEmbeddings
from psych_sidecar.search.gloss import english_gloss
from psych_sidecar.search.ranking import (
    Embeddings,
    SearchDocument,
    SearchHit,
    SearchIndex,
    first_sentence,
    identifier_words,
    tokenize,
    tool_texts,
)

__all__ = [
    "Embeddings",
    "SearchDocument",
    "SearchHit",
    "SearchIndex",
    "TextEncoder",
    "ToolEmbeddings",
    "english_gloss",
    "first_sentence",
    "identifier_words",
    "tokenize",
    "tool_texts",
]

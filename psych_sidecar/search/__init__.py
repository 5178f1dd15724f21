"""Tool search: keyword ranking (BM25F) fused with sentence embeddings, glosses of Chinese
descriptions, and the sentence encoder with its background warm-up.

Layers inside: :mod:`~psych_sidecar.search.ranking` and :mod:`~psych_sidecar.search.gloss` are
pure (the domain imports ranking directly); :mod:`~psych_sidecar.search.embeddings` owns the
vector cache (memory, and the database through the VectorStore port that storage
implements) and what the warm-up does, :mod:`~psych_sidecar.search.warmup` the threads it runs
on; :mod:`~psych_sidecar.search.model` finds the model's
files and builds the embeddings for the setting; :mod:`~psych_sidecar.search.encoder` runs the
model (numpy), loaded only when semantic search is on. numpy comes with the first search index
or model load, never with importing these modules: a sidecar answers before it needs it.
"""

from __future__ import annotations

from psych_sidecar.search.embeddings import (
    EmbeddingCounters,
    TextEncoder,
    ToolEmbeddings,
    VectorStore,
    content_key,
)
from psych_sidecar.search.gloss import english_gloss
from psych_sidecar.search.ranking import (
    Embeddings,
    Ranking,
    SearchDocument,
    SearchHit,
    SearchIndex,
    first_sentence,
    identifier_words,
    listing_texts,
    normalise_query,
    tokenize,
    tool_texts,
)

__all__ = [
    "EmbeddingCounters",
    "Embeddings",
    "Ranking",
    "SearchDocument",
    "SearchHit",
    "SearchIndex",
    "TextEncoder",
    "ToolEmbeddings",
    "VectorStore",
    "content_key",
    "english_gloss",
    "first_sentence",
    "identifier_words",
    "listing_texts",
    "normalise_query",
    "tokenize",
    "tool_texts",
]

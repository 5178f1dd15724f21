"""Tool search over a permitted catalogue: BM25F keywords fused with sentence embeddings.

Lexical: BM25F, written here on purpose. A tool is a few short *fields* (its name, its server,
its description, its parameter names) of very different value, and the ranking libraries
(`bm25s`, `rank-bm25`) score one flat bag of words per document — they have no field weighting
(BM25F), so the usual workaround is repeating tokens, which also inflates document lengths. A
per-Run catalogue is hundreds to a few thousand tools; scoring postings in pure Python takes
well under a millisecond there, and rank-bm25 scores every document on every query and has not
been released since 2022.

- identifiers are split: ``get_current_time``, ``getCurrentTime`` and ``get-current-time`` all
  give ``get current time`` (and the whole name is kept as one more term);
- English words are lowercased, stop words dropped, and stemmed (Snowball, ``snowballstemmer``);
- runs of CJK characters become overlapping character bigrams (plus each character), the
  usual dictionary-free way to index Chinese and Japanese;
- Chinese text is also glossed into English (CC-CEDICT, ``domain/gloss.py``) as fields of its
  own, so "trending news" finds a tool described as 获取热榜 (and a Chinese query is glossed
  to meet English descriptions);
- a description's first sentence is a field too: it says what the tool is for, while the
  usage notes after it (some run to pages) dilute the whole description;
- fields are weighted and length-normalised separately (BM25F), so a query word in a tool's
  name counts more than the same word deep in a long description.

Semantic (when a :class:`TextEncoder` is configured): keywords miss a tool whose description
says "fetch" when the query says "download". Each tool gets two sentence vectors, its name
read as words and its description (for a Chinese description: the name words and the English
gloss, as the model reads English only), and its similarity to the query is the larger cosine
of the two: a long description does not drown what the name says. The model is
all-MiniLM-L6-v2 run in numpy (``psych_sidecar/embedding.py`` says why not
sentence-transformers: it would pull in torch). Vectors are kept by content hash
(:class:`ToolEmbeddings`), so a catalogue change encodes only the tools whose text changed, and
a query costs one short encoding plus a matrix-vector product.

Fusion: reciprocal rank fusion (Cormack, Clarke & Büttcher 2009) — rank-based, so the two
scores' different scales need no calibration (the constant is below, with why it is 10). A
tool below a minimum cosine is not a semantic match at all and can only come from the
keywords. An exact tool name (``tool``, ``server/tool`` or ``server__tool``) ranks first either way.

Without an encoder (the model package is not installed, or ``semantic_search = "off"``) the
ranking is BM25F alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import snowballstemmer

from psych_sidecar.domain.gloss import HAN_RUN, english_gloss
from psych_sidecar.domain.ports import TextEncoder

log = logging.getLogger(__name__)

# BM25F parameters: term-frequency saturation, and per field (weight, length normalisation).
_K1 = 1.2
_FIELDS: dict[str, tuple[float, float]] = {
    "name": (3.0, 0.3),
    "server": (1.0, 0.3),
    "server_description": (0.3, 0.75),
    "server_description_gloss": (0.3, 0.75),
    "summary": (1.0, 0.5),
    "description": (1.0, 0.75),
    "description_gloss": (1.0, 0.75),
    "parameters": (0.6, 0.5),
}
# Reciprocal rank fusion's constant: a document's fused score is the sum of 1 / (10 + rank).
# Cormack et al. used 60 for long web rankings; a tool search is read in its first five to
# ten results, and a smaller constant lets a strong first place in either ranking count
# (measured on LiveMCPBench: recall@5 +0.01 to +0.02 over 60, see docs/tool-surface.md).
_RRF_K = 10
# Below this cosine a tool is no semantic match (unrelated sentences score about 0.0-0.15 with
# this model): it is left out of the semantic ranking, so a query matching nothing finds nothing.
_MIN_SIMILARITY = 0.2
# Texts per warm-up encoding: small enough that closing stops a warm-up within a second.
_WARM_CHUNK = 64

Vectors = npt.NDArray[np.float32]

_STOP_WORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "him",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_CJK_RUN = re.compile(rf"[{_CJK}]+")
_WORDS = re.compile(r"[^\W_]+")
# A sentence ends at . ! ? followed by a space, or at a CJK full stop, exclamation or question mark.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])")
_STEMMER = snowballstemmer.stemmer("english")


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    stemmed: str = _STEMMER.stemWord(word)
    return stemmed


def tokenize(text: str) -> list[str]:
    """Search terms of a text: split identifiers, stemmed English words, CJK bigrams."""
    terms: list[str] = []
    for token in _TOKEN.findall(_CAMEL_BOUNDARY.sub(" ", text)):
        if _CJK_RUN.fullmatch(token):
            terms.extend(token)
            terms.extend(token[i : i + 2] for i in range(len(token) - 1))
            continue
        word = token.lower()
        if word not in _STOP_WORDS:
            terms.append(_stem(word))
    return terms


def _name_terms(name: str) -> list[str]:
    """An identifier's words plus the whole name, so an exact name still matches as one term."""
    whole = name.lower()
    terms = tokenize(name)
    return [*terms, whole] if [whole] != terms else terms


@dataclass(frozen=True, slots=True)
class SearchDocument:
    server: str
    name: str
    description: str
    parameter_names: tuple[str, ...] = ()
    server_description: str = ""


@dataclass(frozen=True, slots=True)
class SearchHit:
    index: int
    score: float


class _Bm25F:
    """BM25F over documents given as {field: terms}."""

    def __init__(
        self, documents: Sequence[dict[str, list[str]]], fields: dict[str, tuple[float, float]]
    ) -> None:
        count = len(documents)
        averages = {
            field: (sum(len(d.get(field, ())) for d in documents) / count if count else 0.0) or 1.0
            for field in fields
        }
        self.postings: dict[str, list[tuple[int, float]]] = {}
        for index, document in enumerate(documents):
            weighted: dict[str, float] = {}
            for field, terms in document.items():
                if not terms:
                    continue
                weight, b = fields[field]
                norm = 1 - b + b * len(terms) / averages[field]
                for term, count_in_field in Counter(terms).items():
                    weighted[term] = weighted.get(term, 0.0) + weight * count_in_field / norm
            for term, frequency in weighted.items():
                self.postings.setdefault(term, []).append((index, frequency))
        self.idf = {
            term: math.log(1 + (count - len(posting) + 0.5) / (len(posting) + 0.5))
            for term, posting in self.postings.items()
        }

    def scores(self, terms: set[str]) -> dict[int, float]:
        scores: dict[int, float] = {}
        for term in terms:
            posting = self.postings.get(term)
            if posting is None:
                continue
            idf = self.idf[term]
            for index, frequency in posting:
                scores[index] = scores.get(index, 0.0) + idf * frequency / (_K1 + frequency)
        return scores


class ToolEmbeddings:
    """Sentence vectors of tool texts and queries, each text encoded once and kept by content
    hash (least recently used out first). Shared by every search index of the process.

    The encoder is loaded on first use (the first warm-up or search): a sidecar with no
    catalogue never loads the model. If loading fails, search stays lexical (logged once)
    rather than failing.
    """

    def __init__(
        self, load_encoder: Callable[[], TextEncoder | None], capacity: int = 20_000
    ) -> None:
        self._load_encoder = load_encoder
        self._encoder: TextEncoder | None = None
        self._loaded = False
        self._load_lock = threading.Lock()
        self._capacity = capacity
        self._vectors: OrderedDict[bytes, Vectors] = OrderedDict()
        self._cache_lock = threading.Lock()
        # One catalogue encoding at a time: encoding is CPU-bound, and a second index over the
        # same tools waits and then finds them all encoded. Queries do not take it, so a
        # search never waits for another catalogue's encoding.
        self._catalogue_lock = threading.Lock()
        # Warm-up runs on its own thread, one listing after another, never on a request's.
        self._warmer: ThreadPoolExecutor | None = None
        self._closed = threading.Event()

    def available(self) -> bool:
        """Whether an encoder is there (loading it on first call)."""
        with self._load_lock:
            if not self._loaded:
                self._loaded = True
                try:
                    self._encoder = self._load_encoder()
                except Exception:
                    log.exception("semantic search off: the sentence encoder failed to load")
            return self._encoder is not None

    def vectors(self, texts: Sequence[str]) -> Vectors:
        """One row per tool text, encoding those not seen before in one batch."""
        keys = [_content_key(text) for text in texts]
        rows, _ = self._encoded(dict(zip(keys, texts, strict=True)))
        if not keys:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([rows[key] for key in keys])

    def _encoded(self, text_of: dict[bytes, str]) -> tuple[dict[bytes, Vectors], int]:
        """The rows of these texts (by content key), and how many had to be encoded now."""
        with self._catalogue_lock:
            rows = self._cached(text_of)
            missing = [key for key in text_of if key not in rows]
            if missing:
                encoded = self._encoder_or_fail().encode([text_of[key] for key in missing])
                rows.update(zip(missing, encoded, strict=True))
                self._remember(zip(missing, encoded, strict=True))
        return rows, len(missing)

    def warm_in_background(self, tools: Sequence[tuple[str, str]]) -> Future[None] | None:
        """Encode the texts of (name, description) pairs not encoded yet, on a background
        thread: called when a connection's listing is stored, so the first search of a
        surface over those tools finds them encoded (or waits for the encoding under way
        rather than starting its own). Loads the model on first use. None once closed."""
        if self._closed.is_set():
            return None
        if self._warmer is None:
            self._warmer = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="search-warmup", initializer=_lowest_priority
            )
        return self._warmer.submit(self._warm, list(tools))

    def close(self) -> None:
        """Stop warming: queued listings are dropped, the one under way stops at its next
        chunk, so shutting down never waits for a catalogue's encoding."""
        self._closed.set()
        if self._warmer is not None:
            self._warmer.shutdown(wait=False, cancel_futures=True)

    def _warm(self, tools: list[tuple[str, str]]) -> None:
        try:
            if not self.available():
                return
            started = time.monotonic()
            # Similar lengths together, so the encoder's batches carry little padding.
            texts = sorted(
                {text for name, description in tools for text in tool_texts(name, description)},
                key=len,
            )
            encoded = 0
            for start in range(0, len(texts), _WARM_CHUNK):
                if self._closed.is_set():
                    return
                chunk = {_content_key(text): text for text in texts[start : start + _WARM_CHUNK]}
                encoded += self._encoded(chunk)[1]
            if encoded:
                log.info(
                    "search warm-up: %d new texts of %d tools encoded in %.1f s",
                    encoded,
                    len(tools),
                    time.monotonic() - started,
                )
        except Exception:
            log.exception("search warm-up failed; the first search will encode instead")

    def query_vector(self, query: str) -> Vectors:
        """The query's row (cached too: paging through results asks again)."""
        key = _content_key(query)
        row = self._cached({key: query}).get(key)
        if row is None:
            row = self._encoder_or_fail().encode([query])[0]
            self._remember([(key, row)])
        return row

    def _encoder_or_fail(self) -> TextEncoder:
        if self._encoder is None:
            raise RuntimeError("no sentence encoder: check available() first")
        return self._encoder

    def _cached(self, text_of: dict[bytes, str]) -> dict[bytes, Vectors]:
        found = {}
        with self._cache_lock:
            for key in text_of:
                row = self._vectors.get(key)
                if row is not None:
                    self._vectors.move_to_end(key)
                    found[key] = row
        return found

    def _remember(self, rows: Iterable[tuple[bytes, Vectors]]) -> None:
        with self._cache_lock:
            self._vectors.update(rows)
            while len(self._vectors) > self._capacity:
                self._vectors.popitem(last=False)


def _lowest_priority() -> None:
    """Run the calling thread at the lowest CPU priority (nice 19), so a warm-up takes only
    the CPU that requests leave idle. Linux keeps a nice value per thread; elsewhere it is
    per process, so this does nothing there rather than slow the whole sidecar."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _content_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class SearchIndex:
    """An immutable index over documents; build it once per catalogue and reuse it. With
    `embeddings` (and an encoder available) the ranking is hybrid; building then encodes every
    tool text not encoded before, the expensive step of a new catalogue."""

    def __init__(
        self, documents: Sequence[SearchDocument], embeddings: ToolEmbeddings | None = None
    ) -> None:
        self._documents = list(documents)
        self._tools = _Bm25F([self._fields(document) for document in self._documents], _FIELDS)
        self._exact: dict[str, list[int]] = {}
        for index, document in enumerate(self._documents):
            for key in (
                document.name,
                f"{document.server}/{document.name}",
                f"{document.server}__{document.name}",
            ):
                self._exact.setdefault(key.lower(), []).append(index)
        self._embeddings = embeddings if embeddings is not None and embeddings.available() else None
        self._name_vectors = self._description_vectors = np.zeros((0, 0), dtype=np.float32)
        if self._embeddings is not None and self._documents:
            texts = [tool_texts(d.name, d.description) for d in self._documents]
            self._name_vectors = self._embeddings.vectors([name for name, _ in texts])
            self._description_vectors = self._embeddings.vectors([desc for _, desc in texts])

    @property
    def semantic(self) -> bool:
        """Whether the ranking fuses sentence embeddings with the keywords."""
        return self._embeddings is not None

    @staticmethod
    def _fields(document: SearchDocument) -> dict[str, list[str]]:
        summary = first_sentence(document.description)
        return {
            "name": _name_terms(document.name),
            "server": _name_terms(document.server),
            "server_description": tokenize(document.server_description),
            "server_description_gloss": tokenize(english_gloss(document.server_description)),
            "summary": tokenize(summary) + tokenize(english_gloss(summary)),
            "description": tokenize(document.description),
            "description_gloss": tokenize(english_gloss(document.description)),
            "parameters": [t for p in document.parameter_names for t in tokenize(p)],
        }

    def search(self, query: str, limit: int) -> list[SearchHit]:
        """The best `limit` documents for the query, best first; ties by catalogue order.
        Documents matching no query term and no close meaning are left out."""
        # A Chinese query's gloss lets it match English descriptions too.
        terms = set(tokenize(query)) | set(tokenize(english_gloss(query))) | {query.strip().lower()}
        lexical = self._tools.scores(terms)
        if self._embeddings is not None and self._documents:
            scores = self._fused(lexical, self._embeddings.query_vector(query))
        else:
            scores = np.zeros(len(self._documents))
            scores[list(lexical)] = list(lexical.values())
        exact = self._exact.get(query.strip().lower(), [])
        if exact:
            scores[exact] = scores.max() + 1.0
        candidates = np.flatnonzero(scores)
        ranked = candidates[np.lexsort((candidates, -scores[candidates]))][:limit]
        return [SearchHit(int(index), float(scores[index])) for index in ranked]

    def _fused(self, lexical: dict[int, float], query: Vectors) -> npt.NDArray[np.float64]:
        """Reciprocal rank fusion of the keyword ranking and the semantic one, per document
        (0 for a document in neither)."""
        similarity = np.maximum(self._name_vectors @ query, self._description_vectors @ query)
        # Stable sort on the negated similarity: ties keep catalogue order.
        semantic = np.argsort(-similarity, kind="stable")
        semantic = semantic[similarity[semantic] >= _MIN_SIMILARITY]
        keyword = sorted(lexical, key=lambda index: (-lexical[index], index))
        fused = np.zeros(len(self._documents))
        fused[keyword] += 1.0 / (_RRF_K + np.arange(1, len(keyword) + 1))
        fused[semantic] += 1.0 / (_RRF_K + np.arange(1, len(semantic) + 1))
        return fused


def tool_texts(name: str, description: str) -> tuple[str, str]:
    """What the encoder reads for a tool: its name as words, and its description. The model
    knows English only, so a description with Chinese in it is read as the name words and the
    English gloss."""
    words = identifier_words(name)
    description = description.strip()
    if HAN_RUN.search(description):
        return words, f"{words}. {english_gloss(description)}"
    return words, description or words


def first_sentence(text: str) -> str:
    """A description's first sentence (up to its first line break at most): what the tool is
    for, before the usage notes, examples and caveats that follow it in long descriptions."""
    line = text.strip().split("\n", 1)[0]
    return _SENTENCE_END.split(line, maxsplit=1)[0]


def identifier_words(name: str) -> str:
    """A tool name read as words for the encoder (which lowercases): `get_current_time` gives
    `get current time`, `getCurrentTime` gives `get Current Time`."""
    return " ".join(_WORDS.findall(_CAMEL_BOUNDARY.sub(" ", name)))

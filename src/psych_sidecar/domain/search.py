"""Keyword search over a permitted tool catalogue: BM25F, written here on purpose.

Why hand-written rather than `bm25s` or `rank-bm25`: a tool is a few short *fields* (its name,
its server, its description, its parameter names) of very different value, and the ranking
libraries score one flat bag of words per document — they have no field weighting (BM25F), so
the usual workaround is repeating tokens, which also inflates document lengths. A per-Run
catalogue is hundreds to a few thousand tools; scoring postings in pure Python takes well under
a millisecond there, so numpy/scipy (bm25s) would buy nothing but weight, and rank-bm25 scores
every document on every query and has not been released since 2022.

What the ranking does, none of it specific to any data set:

- identifiers are split: ``get_current_time``, ``getCurrentTime`` and ``get-current-time`` all
  give ``get current time`` (and the whole name is kept as one more term);
- English words are lowercased, stop words dropped, and stemmed (Snowball, ``snowballstemmer``);
- runs of CJK characters become overlapping character bigrams (plus each character), the
  usual dictionary-free way to index Chinese and Japanese;
- fields are weighted and length-normalised separately (BM25F), so a query word in a tool's
  name counts more than the same word deep in a long description;
- an exact tool name (``tool``, ``server/tool`` or ``server__tool``) ranks first.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import snowballstemmer

# BM25F parameters: term-frequency saturation, and per field (weight, length normalisation).
_K1 = 1.2
_FIELDS: dict[str, tuple[float, float]] = {
    "name": (3.0, 0.3),
    "server": (1.0, 0.3),
    "server_description": (0.3, 0.75),
    "description": (1.0, 0.75),
    "parameters": (0.6, 0.5),
}

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


class SearchIndex:
    """An immutable index over documents; build it once per catalogue and reuse it."""

    def __init__(self, documents: Sequence[SearchDocument]) -> None:
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

    @staticmethod
    def _fields(document: SearchDocument) -> dict[str, list[str]]:
        return {
            "name": _name_terms(document.name),
            "server": _name_terms(document.server),
            "server_description": tokenize(document.server_description),
            "description": tokenize(document.description),
            "parameters": [t for p in document.parameter_names for t in tokenize(p)],
        }

    def search(self, query: str, limit: int) -> list[SearchHit]:
        """The best `limit` documents for the query, best first; ties by catalogue order.
        Documents matching no query term are left out."""
        terms = set(tokenize(query)) | {query.strip().lower()}
        scores = self._tools.scores(terms)
        exact = self._exact.get(query.strip().lower(), [])
        if exact:
            top = max(scores.values(), default=0.0) + 1.0
            for index in exact:
                scores[index] = top
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
        return [SearchHit(index, score) for index, score in ranked[:limit]]

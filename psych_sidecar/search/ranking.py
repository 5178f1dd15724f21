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
- common identifier abbreviations (``info``, ``repo``, ``dir``, ``msg``…) also count as the word
  they stand for, so ``get_repo_info`` meets "repository information";
- a query's URLs and file paths are read as the kind of argument they are ("URL", "file path"),
  not as words: ``/root/markdown/cv.md`` asks for no tool about markdown (both rankings read
  the query this way);
- runs of CJK characters become overlapping character bigrams (plus each character), the
  usual dictionary-free way to index Chinese and Japanese;
- Chinese text is also glossed into English (CC-CEDICT, ``search/gloss.py``) as fields of its
  own, so "trending news" finds a tool described as 获取热榜 (and a Chinese query is glossed
  to meet English descriptions);
- a description's first sentence is a field too: it says what the tool is for, while the
  usage notes after it (some run to pages) dilute the whole description. A leading sentence
  that opens the descriptions of several tools of one server is template text and is skipped
  for the next (``_summaries``);
- fields are weighted and length-normalised separately (BM25F), so a query word in a tool's
  name counts more than the same word deep in a long description.

Semantic (when a :class:`TextEncoder` is configured): keywords miss a tool whose description
says "fetch" when the query says "download". Each tool gets two sentence vectors, its name
read as words and its description (for a Chinese description: the name words and the English
gloss, as the model reads English only), and its similarity to the query is the larger cosine
of the two: a long description does not drown what the name says. The model is
all-MiniLM-L6-v2 run in numpy (``search/encoder.py`` says why not
sentence-transformers: it would pull in torch). Vectors are kept by content hash, in memory and
in the database (:class:`ToolEmbeddings`), so a catalogue change encodes only the tools whose
text changed, and a query costs one short encoding plus a matrix-vector product. An index never
encodes: tools whose vectors are not there yet rank by keywords alone and the ranking says it
is partial (:class:`Ranking`).

Fusion: reciprocal rank fusion (Cormack, Clarke & Büttcher 2009) — rank-based, so the two
scores' different scales need no calibration (the constant is below, with why it is 10). A
tool below a minimum cosine is not a semantic match at all and can only come from the
keywords. An exact tool name (``tool``, ``server/tool`` or ``server__tool``) ranks first either way.

Without an encoder (the model package is not installed, or ``semantic_search = "off"``) the
ranking is BM25F alone.
"""

from __future__ import annotations

import copy
import logging
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from psych_sidecar.search.gloss import HAN_RUN, english_gloss

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Vectors = npt.NDArray[np.float32]

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
# A leading sentence shared by this many tools of one server is template text, and how many
# such sentences in a row are skipped looking for a tool's own summary (see _summaries).
_BOILERPLATE_TOOLS = 3
_BOILERPLATE_DEPTH = 3
# Reciprocal rank fusion's constant: a document's fused score is the sum of 1 / (10 + rank).
# Cormack et al. used 60 for long web rankings; a tool search is read in its first five to
# ten results, and a smaller constant lets a strong first place in either ranking count
# (measured on LiveMCPBench: recall@5 +0.01 to +0.02 over 60, see docs/tool-surface.md).
_RRF_K = 10
# Below this cosine a tool is no semantic match (unrelated sentences score about 0.0-0.15 with
# this model): it is left out of the semantic ranking, so a query matching nothing finds nothing.
_MIN_SIMILARITY = 0.2

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

# Abbreviations common in identifiers, read as the word they stand for as well (the abbreviation
# stays a term too): a tool named `get_repo_info` matches a query asking for "repository
# information", and a query saying "dir" matches a description saying "directory". The usual
# identifier expansion of code search (Lawrie & Binkley 2011, "Expanding identifiers to
# normalize source code vocabulary"), here as a fixed list of unambiguous programming
# abbreviations, not learned from any benchmark.
_ABBREVIATIONS: dict[str, str] = {
    "addr": "address",
    "arg": "argument",
    "args": "arguments",
    "auth": "authentication",
    "btn": "button",
    "calc": "calculate",
    "cfg": "configuration",
    "char": "character",
    "cmd": "command",
    "col": "column",
    "cols": "columns",
    "conf": "configuration",
    "config": "configuration",
    "coord": "coordinate",
    "coords": "coordinates",
    "cur": "current",
    "curr": "current",
    "db": "database",
    "del": "delete",
    "desc": "description",
    "dest": "destination",
    "dir": "directory",
    "dirs": "directories",
    "doc": "document",
    "docs": "documents",
    "dst": "destination",
    "env": "environment",
    "err": "error",
    "exec": "execute",
    "fmt": "format",
    "fn": "function",
    "func": "function",
    "gen": "generate",
    "hist": "history",
    "idx": "index",
    "img": "image",
    "imgs": "images",
    "info": "information",
    "init": "initialize",
    "lang": "language",
    "len": "length",
    "lib": "library",
    "libs": "libraries",
    "loc": "location",
    "mem": "memory",
    "mgr": "manager",
    "msg": "message",
    "msgs": "messages",
    "nav": "navigation",
    "num": "number",
    "obj": "object",
    "opt": "option",
    "opts": "options",
    "org": "organization",
    "param": "parameter",
    "params": "parameters",
    "pic": "picture",
    "pics": "pictures",
    "pkg": "package",
    "pkgs": "packages",
    "pos": "position",
    "prev": "previous",
    "proc": "process",
    "pwd": "password",
    "qty": "quantity",
    "rand": "random",
    "ref": "reference",
    "refs": "references",
    "repo": "repository",
    "repos": "repositories",
    "req": "request",
    "resp": "response",
    "sched": "schedule",
    "seq": "sequence",
    "src": "source",
    "stat": "statistic",
    "stats": "statistics",
    "str": "string",
    "sys": "system",
    "tbl": "table",
    "temp": "temporary",
    "tmp": "temporary",
    "txt": "text",
    "tz": "timezone",
    "usr": "user",
    "util": "utility",
    "utils": "utilities",
    "val": "value",
    "vals": "values",
    "var": "variable",
    "vars": "variables",
    "ver": "version",
}

# A query's literal arguments: URLs, and file paths (absolute, home- or dot-relative, Windows, or
# a file name with a common extension). Their parts (`/root/markdown/cv.md`: root, markdown,
# cv, md) are the values a tool is called with, not what the tool does, and as keywords they
# match tools that merely mention those words; a tool's description names the kind of argument
# instead ("the URL to fetch", "path of the file to write"). See normalise_query.
_QUERY_URL = re.compile(r"\b(?:https?|ftp)://\S+|\bwww\.\S+", re.IGNORECASE)
_QUERY_PATH = re.compile(
    r"(?<![\w/])(?:~|\.{1,2})?(?:/[\w.\-]+){2,}/?"
    r"|\b[a-z]:\\\S+"
    r"|\b[\w\-]+\.(?:md|txt|pdf|docx?|xlsx?|pptx?|csv|tsv|json|ya?ml|xml|html?|png|jpe?g|gif"
    r"|svg|zip|py|js|ts|log)\b",
    re.IGNORECASE,
)

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_CJK_RUN = re.compile(rf"[{_CJK}]+")
_WORDS = re.compile(r"[^\W_]+")
# A sentence ends at . ! ? followed by a space, or at a CJK full stop, exclamation or question mark.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])")


@lru_cache(maxsize=1)
def _english_stemmer() -> Any:
    """Made with the first word stemmed (a search), not when a sidecar starts."""
    import snowballstemmer

    return snowballstemmer.stemmer("english")


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    stemmed: str = _english_stemmer().stemWord(word)
    return stemmed


def tokenize(text: str) -> list[str]:
    """Search terms of a text: split identifiers, stemmed English words, CJK bigrams."""
    terms: list[str] = []
    for token in _TOKEN.findall(_CAMEL_BOUNDARY.sub(" ", text)):
        # A token is a CJK run or has none (see _TOKEN): its first character says which, and
        # every CJK range starts at U+3040 or above, so most tokens skip the regex.
        if token[0] >= "\u3040" and _CJK_RUN.match(token[0]):
            terms.extend(token)
            terms.extend(token[i : i + 2] for i in range(len(token) - 1))
            continue
        word = token.lower()
        if word not in _STOP_WORDS:
            terms.append(_stem(word))
            expansion = _ABBREVIATIONS.get(word)
            if expansion is not None:
                terms.append(_stem(expansion))
    return terms


def normalise_query(query: str) -> str:
    """The query both rankings read: URLs become the word "URL" and file paths "file path"
    (see _QUERY_URL), so "save it to /root/markdown/cv.md" asks for a tool that saves to a
    file rather than for tools about markdown. An exact tool name is matched on the query as
    sent, before this."""
    return _QUERY_PATH.sub("file path", _QUERY_URL.sub("URL", query))


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
    # What the encoder reads for the tool, from its whole listing (:func:`listing_texts`);
    # None: from the index's documents of the same server, which are the whole listing unless
    # the index sees only some of its tools.
    encoder_texts: tuple[str, str] | None = None


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


class Embeddings(Protocol):
    """What ranking needs of sentence vectors (``search.embeddings.ToolEmbeddings`` implements
    it): the ranking itself keeps no threads and makes no OS calls, and never waits for an
    encoding."""

    def available(self) -> bool:
        """Whether semantic search is on."""
        ...

    def version(self) -> int:
        """Changes whenever more tool vectors become known."""
        ...

    def known_vectors(self, texts: Sequence[str]) -> tuple[Vectors, npt.NDArray[np.bool_]]:
        """The rows known for these texts (zeros for the rest) and which are real, reading
        the store and queueing the missing texts for encoding in the background."""
        ...

    def vectors_in_memory(self, texts: Sequence[str]) -> tuple[Vectors, npt.NDArray[np.bool_]]:
        """The same from this process's memory alone."""
        ...

    def query_vector(self, query: str) -> Vectors | None:
        """The query's row; None while the model is not loaded."""
        ...


@dataclass(frozen=True, slots=True)
class Ranking:
    """A search's hits, and how many of the `documents` searched were ranked by keywords
    alone while semantic search is on: those with no vectors yet, or all of them while the
    model is not loaded to encode the query."""

    hits: list[SearchHit]
    keyword_only: int = 0
    documents: int = 0

    @property
    def partial(self) -> bool:
        """Whether some tools were ranked by keywords alone."""
        return self.keyword_only > 0


class SearchIndex:
    """An index over documents; build it once per catalogue and reuse it. With `embeddings`
    the ranking is hybrid, over the tool vectors known when it was built (the rest are encoded
    in the background, and :meth:`refreshed` picks them up): building never encodes."""

    def __init__(
        self, documents: Sequence[SearchDocument], embeddings: Embeddings | None = None
    ) -> None:
        import numpy as np  # imported with the first index: a sidecar starts without numpy

        self._documents = list(documents)
        summaries = _summaries(self._documents)
        fields = [self._fields(d, s) for d, s in zip(self._documents, summaries, strict=True)]
        self._tools = _Bm25F(fields, _FIELDS)
        self._exact: dict[str, list[int]] = {}
        for index, document in enumerate(self._documents):
            for key in (
                document.name,
                f"{document.server}/{document.name}",
                f"{document.server}__{document.name}",
            ):
                self._exact.setdefault(key.lower(), []).append(index)
        self._embeddings = embeddings if embeddings is not None and embeddings.available() else None
        # Each tool's name-words row, then each tool's description row.
        self._texts: list[str] = []
        self._vectors = np.zeros((0, 0), dtype=np.float32)
        self._have = np.zeros(0, dtype=np.bool_)
        self._version = 0
        if self._embeddings is not None and self._documents:
            texts = _encoder_texts(self._documents)
            self._texts = [name for name, _ in texts] + [desc for _, desc in texts]
            self._version = self._embeddings.version()
            self._vectors, self._have = self._embeddings.known_vectors(self._texts)

    @property
    def approximate_bytes(self) -> int:
        """About what the index keeps in memory: its vectors, its postings (a tuple per
        document and term, ~90 bytes with its list slot and float), its terms and documents.
        An estimate for byte-bounded caches, within a small factor of tracemalloc's figure."""
        postings = sum(len(posting) for posting in self._tools.postings.values())
        documents = sum(300 + len(d.description) for d in self._documents)
        return (
            self._vectors.nbytes
            + self._have.nbytes
            + sum(len(text) + 50 for text in self._texts)
            + 90 * postings
            + 150 * len(self._tools.postings)
            + documents
        )

    @property
    def semantic(self) -> bool:
        """Whether the ranking fuses sentence embeddings with the keywords."""
        return self._embeddings is not None

    @property
    def complete(self) -> bool:
        """Whether every tool has its vectors (always true for keywords alone)."""
        return bool(self._have.all())

    def refreshed(self) -> SearchIndex:
        """This index with the tool vectors that became known since it was built (from
        memory: cheap enough for every search), or itself when nothing changed."""
        import numpy as np

        embeddings = self._embeddings
        if embeddings is None or self.complete or embeddings.version() == self._version:
            return self
        version = embeddings.version()
        missing = np.flatnonzero(~self._have)
        rows, have = embeddings.vectors_in_memory([self._texts[i] for i in missing])
        if not have.any():
            return self
        fresh = copy.copy(self)
        fresh._version = version
        if fresh._vectors.shape[1] != rows.shape[1]:
            fresh._vectors = np.zeros((len(self._texts), rows.shape[1]), dtype=np.float32)
        else:
            fresh._vectors = self._vectors.copy()
        fresh._have = self._have.copy()
        fresh._vectors[missing[have]] = rows[have]
        fresh._have[missing[have]] = True
        return fresh

    @staticmethod
    def _fields(document: SearchDocument, summary: str) -> dict[str, list[str]]:
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
        """The best `limit` documents for the query, best first (see :meth:`rank`)."""
        return self.rank(query, limit).hits

    def rank(self, query: str, limit: int) -> Ranking:
        """The best `limit` documents for the query, best first; ties by catalogue order.
        Documents matching no query term and no close meaning are left out."""
        import numpy as np

        exact = self._exact.get(query.strip().lower(), [])
        text = normalise_query(query)
        # A Chinese query's gloss lets it match English descriptions too.
        terms = set(tokenize(text)) | set(tokenize(english_gloss(text))) | {query.strip().lower()}
        lexical = self._tools.scores(terms)
        query_vector = None
        if self._embeddings is not None and self._documents:
            query_vector = self._embeddings.query_vector(text)
        count = len(self._documents)
        if query_vector is not None and self._vectors.shape[1] == query_vector.shape[0]:
            scores = self._fused(lexical, query_vector)
            keyword_only = count - int(np.count_nonzero(self._have[:count] & self._have[count:]))
        else:
            scores = np.zeros(count)
            scores[list(lexical)] = list(lexical.values())
            keyword_only = count if self._embeddings is not None else 0
        if exact:
            scores[exact] = scores.max() + 1.0
        candidates = np.flatnonzero(scores)
        ranked = candidates[np.lexsort((candidates, -scores[candidates]))][:limit]
        hits = [SearchHit(int(index), float(scores[index])) for index in ranked]
        return Ranking(hits, keyword_only, count)

    def _fused(self, lexical: dict[int, float], query: Vectors) -> npt.NDArray[np.float64]:
        """Reciprocal rank fusion of the keyword ranking and the semantic one, per document
        (0 for a document in neither). A tool with no vector yet has similarity 0: it is in
        the keyword ranking only."""
        import numpy as np

        count = len(self._documents)
        similarity = np.maximum(self._vectors[:count] @ query, self._vectors[count:] @ query)
        # Stable sort on the negated similarity: ties keep catalogue order.
        semantic = np.argsort(-similarity, kind="stable")
        semantic = semantic[similarity[semantic] >= _MIN_SIMILARITY]
        keyword = sorted(lexical, key=lambda index: (-lexical[index], index))
        fused = np.zeros(count)
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


def listing_texts(tools: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """What the encoder reads for each (name, description) of one server's listing: its
    :func:`tool_texts`, with the description's leading sentence left out where it is the
    listing's template (it opens the descriptions of at least _BOILERPLATE_TOOLS of its
    tools, as "Twilio - Api: This is the public Twilio REST API." opens 1,403 of Twilio's
    1,409). Every tool of such a listing would otherwise be encoded with the same words in
    front of its own, a third of Twilio's tokens, and the sentence says nothing that tells
    its tools apart. One sentence only: what is left out depends on the listing's texts
    alone, so the texts it could give are those of the listing's tools with or without their
    first sentence (:meth:`~psych_sidecar.search.embeddings.ToolEmbeddings.collect` keeps
    both)."""
    descriptions = [description for _, description in tools]
    kept, _ = _without_templates([""] * len(tools), descriptions, depth=1)
    return [
        tool_texts(name, description) for (name, _), description in zip(tools, kept, strict=True)
    ]


def _encoder_texts(documents: Sequence[SearchDocument]) -> list[tuple[str, str]]:
    """Each document's encoder texts: its own when given, else :func:`listing_texts` over the
    documents of its server."""
    texts: list[tuple[str, str] | None] = [d.encoder_texts for d in documents]
    by_server: dict[str, list[int]] = {}
    for index, document in enumerate(documents):
        if document.encoder_texts is None:
            by_server.setdefault(document.server, []).append(index)
    for indexes in by_server.values():
        listing = [(documents[i].name, documents[i].description) for i in indexes]
        for index, pair in zip(indexes, listing_texts(listing), strict=True):
            texts[index] = pair
    return [pair for pair in texts if pair is not None]


def _summaries(documents: Sequence[SearchDocument]) -> list[str]:
    """Each tool's summary: the first sentence of its description that is not boilerplate
    (see _without_templates). It stays in the description field; a description that is
    nothing but boilerplate keeps it as its summary."""
    _, summaries = _without_templates(
        [document.server for document in documents],
        [document.description for document in documents],
        depth=_BOILERPLATE_DEPTH,
    )
    return summaries


def _without_templates(
    servers: Sequence[str], descriptions: Sequence[str], depth: int
) -> tuple[list[str], list[str]]:
    """The descriptions (stripped) without their leading template sentences, up to `depth` of
    them, and the first sentence of each of those. A sentence that opens the descriptions of
    at least _BOILERPLATE_TOOLS tools of one server is the server's template, not what a tool
    does (a generated catalogue prefixes every tool with "Twilio - Api: This is the public
    Twilio REST API."; template detection by repetition, as web indexing drops navigation
    text repeated across a site's pages). A description that is nothing but boilerplate
    keeps its last sentence."""
    texts = [description.strip() for description in descriptions]
    summaries = [first_sentence(text) for text in texts]
    for _ in range(depth):
        counts = Counter(
            (server, summary) for server, summary in zip(servers, summaries, strict=True) if summary
        )
        changed = False
        for index, server in enumerate(servers):
            summary = summaries[index]
            if counts[server, summary] < _BOILERPLATE_TOOLS:
                continue
            rest = texts[index][texts[index].find(summary) + len(summary) :].strip()
            if first_sentence(rest):
                texts[index], summaries[index], changed = rest, first_sentence(rest), True
        if not changed:
            break
    return texts, summaries


def identifier_words(name: str) -> str:
    """A tool name read as words for the encoder (which lowercases): `get_current_time` gives
    `get current time`, `getCurrentTime` gives `get Current Time`."""
    return " ".join(_WORDS.findall(_CAMEL_BOUNDARY.sub(" ", name)))

"""Sentence vectors of tool texts: kept in memory and in the database (shared by every sidecar
on it, kept across restarts), and encoded only in the background, the warm-up: one listing
after another, each listing's chunks on `encode_threads` threads at the lowest priority.

The threads themselves and their nice value are :mod:`psych_sidecar.search.warmup`'s; ranking
(:mod:`psych_sidecar.search.ranking`) only reads vectors. The database
is reached through the :class:`VectorStore` port, which storage implements: search never
imports storage.

Where a text's vector comes from, cheapest first: this process's memory (least recently used
out), the store (one batched read per listing or search), the encoder. Requests never encode a
catalogue text and never wait for the model: a search over texts with no vector yet gets the
vectors there are, and the missing texts are queued for the warm-up (see
:meth:`ToolEmbeddings.known_vectors`). A request encodes only its own query, once the model is
loaded.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from psych_sidecar.search.ranking import listing_texts, tool_texts
from psych_sidecar.search.warmup import WarmupThreads

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from psych_sidecar.search.ranking import Vectors

log = logging.getLogger(__name__)

# Texts per warm-up encoding: small enough that closing stops a warm-up within a second, and
# the unit two sidecars warming the same listing share out (each takes the chunks in its own
# random order and skips the ones the other has stored meanwhile).
_WARM_CHUNK = 64
# How often, at most, a sidecar collects orphaned vectors (after a warm-up; see collect()).
COLLECT_INTERVAL_S = 24 * 3600.0
# Query vectors kept in memory (paging through results asks again).
_QUERY_CAPACITY = 1024
# Stored vectors are float32, little-endian.
_STORED_DTYPE = "<f4"


class TextEncoder(Protocol):
    """Texts to sentence vectors (:class:`~psych_sidecar.search.encoder.MiniLmEncoder`)."""

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One unit-length row per text, in order; the same text always gives the same row."""
        ...


class VectorStore(Protocol):
    """Where vectors are kept for every sidecar on the database (``storage.search_vectors``).
    A key is :func:`content_key` of the exact text; `encoder` names the model that made it."""

    def read_vectors(self, encoder: str, keys: Sequence[str]) -> dict[str, bytes]:
        """The stored rows among these keys (absent keys are left out)."""
        ...

    def write_vectors(self, encoder: str, rows: Sequence[tuple[str, bytes]]) -> None:
        """Store rows; a key already stored keeps its row."""
        ...

    def vector_keys(self) -> list[tuple[str, str]]:
        """Every stored (encoder, key)."""
        ...

    def catalogue_listings(self) -> Iterable[Sequence[tuple[str, str]]]:
        """For each server of each tenant, every distinct (tool name, description) of every
        one of its catalogue versions."""
        ...

    def delete_vectors(self, keys: Sequence[tuple[str, str]]) -> int:
        """Delete these (encoder, key) rows; how many there were."""
        ...


@dataclass(frozen=True, slots=True)
class EmbeddingCounters:
    """What this process's embeddings did since it started (for logs, tests and metrics)."""

    # Catalogue texts this process encoded (on the warm-up thread only).
    texts_encoded: int = 0
    # Query texts encoded (on request threads, one per query not seen recently).
    queries_encoded: int = 0
    # Vectors read from the store instead of being encoded.
    vectors_read: int = 0
    # Vectors this process wrote to the store.
    vectors_written: int = 0
    # Orphaned vectors this process deleted from the store.
    vectors_collected: int = 0
    # Texts queued for the warm-up and not yet done (the warm-up backlog).
    backlog: int = 0
    # Seconds the model took to load; None until it has loaded.
    model_load_seconds: float | None = None


class ToolEmbeddings:
    """Sentence vectors of tool texts and queries for every search index of the process.

    The encoder loads on a thread of its own through :meth:`prepare` (the server calls it at
    start), or with the first listing to warm. If loading fails, search stays lexical (logged
    once) rather than failing.
    """

    def __init__(
        self,
        load_encoder: Callable[[], TextEncoder | None],
        *,
        encoder_id: str = "",
        store: VectorStore | None = None,
        capacity: int = 20_000,
        encode_threads: int = 1,
    ) -> None:
        self._load_encoder = load_encoder
        self.encoder_id = encoder_id
        self._store = store if encoder_id else None
        self._encoder: TextEncoder | None = None
        self._loaded = False
        self._load_lock = threading.Lock()
        self._capacity = capacity
        self._vectors: OrderedDict[str, Vectors] = OrderedDict()
        self._queries: OrderedDict[str, Vectors] = OrderedDict()
        self._dimension = 0
        # Guards the two caches, the pending set, the version and the counters.
        self._lock = threading.Lock()
        # Keys queued for the warm-up and not done yet: a key is queued once.
        self._pending: set[str] = set()
        # Bumped whenever catalogue vectors are added to memory: a partial index re-reads
        # memory only when it changed.
        self._version = 0
        self._counters = EmbeddingCounters()
        self._last_collection: float | None = None
        self._threads = WarmupThreads(encode_threads)
        self._chunk_order = random.Random()

    # What ranking needs (search.ranking.Embeddings)

    def available(self) -> bool:
        """Whether semantic search is on: false only once the encoder failed to load."""
        return not (self._loaded and self._encoder is None)

    def version(self) -> int:
        """Changes whenever catalogue vectors are added to this process's memory."""
        return self._version

    def known_vectors(self, texts: Sequence[str]) -> tuple[Vectors, npt.NDArray[np.bool_]]:
        """The vectors there are for these texts, without encoding: one row per text (zeros
        where there is none yet) and which rows are real. Texts not in memory are read from
        the store in one batch, and those it lacks too are queued for the warm-up (once)."""
        keys = [content_key(text) for text in texts]
        rows = self._cached(keys)
        text_of = {key: text for key, text in zip(keys, texts, strict=True) if key not in rows}
        if text_of:
            rows.update(self._read_store(list(text_of)))
            self._queue({key: text for key, text in text_of.items() if key not in rows})
        return self._matrix(keys, rows)

    def vectors_in_memory(self, texts: Sequence[str]) -> tuple[Vectors, npt.NDArray[np.bool_]]:
        """The same from memory alone: no store read, nothing queued (a partial index
        catching up)."""
        keys = [content_key(text) for text in texts]
        return self._matrix(keys, self._cached(keys))

    def _matrix(
        self, keys: list[str], rows: dict[str, Vectors]
    ) -> tuple[Vectors, npt.NDArray[np.bool_]]:
        """One row per key (zeros where `rows` has none), and which rows are real."""
        # numpy comes with the first search, not with the sidecar's start.
        import numpy as np

        have = np.array([key in rows for key in keys], dtype=np.bool_)
        matrix = np.zeros((len(keys), self._dimension), dtype=np.float32)
        for position, key in enumerate(keys):
            row = rows.get(key)
            if row is not None:
                matrix[position] = row
        return matrix, have

    def query_vector(self, query: str) -> Vectors | None:
        """The query's row, encoded on the caller's thread (a short text); None while the
        model is not loaded (its loading is then started, see :meth:`prepare`)."""
        key = content_key(query)
        with self._lock:
            for cache in (self._queries, self._vectors):
                cached = cache.get(key)
                if cached is not None:
                    cache.move_to_end(key)
                    return cached
        encoder = self._encoder
        if encoder is None:
            self.prepare()
            return None
        row: Vectors = encoder.encode([query])[0]
        with self._lock:
            self._counters = replace(
                self._counters, queries_encoded=self._counters.queries_encoded + 1
            )
            self._queries[key] = row
            while len(self._queries) > _QUERY_CAPACITY:
                self._queries.popitem(last=False)
        return row

    # Background work

    def prepare(self) -> None:
        """Start loading the model (once) on a thread of its own, without waiting. Unlike
        encoding, the load runs at normal priority: searches wait for it to rank by meaning
        (their queries need the model), and it is about a second of CPU once per process;
        at nice 19 on a busy machine it took several times that."""
        if not self._loaded:
            self._threads.start_loader(self._load_logged)

    def _load_logged(self) -> None:
        try:
            self.load()
        except Exception:  # load() logs its own failures; this is for anything else
            log.exception("semantic search: loading the model failed")

    def warm_in_background(self, tools: Sequence[tuple[str, str]]) -> Future[None] | None:
        """Make the texts of (name, description) pairs ready on the warm-up thread: called
        when a connection's listing (one server's tools) is stored, so the first search over
        those tools finds them. None once closed or when there is nothing new to do."""
        texts = {text for pair in listing_texts(tools) for text in pair}
        return self._queue({content_key(text): text for text in texts}, len(tools))

    def warm(self, tools: Sequence[tuple[str, str]]) -> None:
        """The same on the caller's thread (benchmarks, offline evaluation)."""
        texts = {text for pair in listing_texts(tools) for text in pair}
        text_of = {content_key(text): text for text in texts}
        with self._lock:
            self._pending.update(text_of)
        self._fill(text_of, len(tools))

    def close(self, wait: bool = False) -> None:
        """Stop warming: queued jobs are dropped, the one under way stops at its next chunk
        (so shutting down never waits for a whole catalogue's encoding). With `wait`, return
        once that job has stopped: the store is no longer used after this returns."""
        self._threads.close(wait)

    def counters(self) -> EmbeddingCounters:
        with self._lock:
            return replace(self._counters, backlog=len(self._pending))

    def load(self) -> bool:
        """Load the encoder if not loaded yet (blocking); whether there is one."""
        with self._load_lock:
            if not self._loaded:
                started = time.monotonic()
                try:
                    encoder = self._load_encoder()
                except Exception:
                    log.exception("semantic search off: the sentence encoder failed to load")
                    encoder = None
                if encoder is not None:
                    with self._lock:
                        self._counters = replace(
                            self._counters, model_load_seconds=time.monotonic() - started
                        )
                self._encoder = encoder
                self._loaded = True
            return self._encoder is not None

    def vectors(self, texts: Sequence[str]) -> Vectors:
        """One row per text, encoding on the caller's thread those there is no vector for
        (offline use: tests, benchmarks; a sidecar's requests use known_vectors)."""
        import numpy as np

        text_of = {content_key(text): text for text in texts}
        with self._lock:
            self._pending.update(text_of)
        rows = self._fill_offline(text_of)
        if len(rows) < len(text_of):
            raise RuntimeError("no sentence encoder: check load() first")
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([rows[content_key(text)] for text in texts])

    def collect(self) -> int:
        """Delete stored vectors that no catalogue version's text needs: those of texts no
        version of any connection has (a tool's name words or description as the encoder
        reads them, see ranking.listing_texts: with or without its first sentence, as the
        server's versions together say, so a text is kept whichever version it came from), and
        those of another encoder identity (another release's model). Keys are read before
        the texts: a vector stored after that read is left alone, and one stored before it
        belongs to a listing already written, whose texts the scan sees. Returns how many
        were deleted."""
        if self._store is None:
            return 0
        started = time.monotonic()
        stored = self._store.vector_keys()
        if self._threads.closed():
            return 0
        live: set[str] = set()
        for listing in self._store.catalogue_listings():
            for pairs in (listing_texts(listing), [tool_texts(*tool) for tool in listing]):
                live.update(content_key(text) for pair in pairs for text in pair)
        orphans = [
            (encoder, key)
            for encoder, key in stored
            if encoder != self.encoder_id or key not in live
        ]
        if self._threads.closed():
            return 0
        deleted = self._store.delete_vectors(orphans) if orphans else 0
        with self._lock:
            self._counters = replace(
                self._counters, vectors_collected=self._counters.vectors_collected + deleted
            )
            self._last_collection = time.monotonic()
        log.info(
            "search vectors: collected %d orphaned of %d stored in %.1f s",
            deleted,
            len(stored),
            time.monotonic() - started,
        )
        return deleted

    def _queue(self, text_of: dict[str, str], tools: int = 0) -> Future[None] | None:
        with self._lock:
            new = {
                key: text
                for key, text in text_of.items()
                if key not in self._pending and key not in self._vectors
            }
            self._pending.update(new)
        if not new:
            return None
        future = self._threads.submit(lambda: self._fill(new, tools))
        if future is None:
            with self._lock:
                self._pending.difference_update(new)
        return future

    def _fill(self, text_of: dict[str, str], tools: int) -> dict[str, Vectors]:
        """Make these texts' vectors known for the warm-up (`_make_known`), stopping at the
        next chunk once closing; log it, then collect orphaned vectors when that is due."""
        try:
            started = time.monotonic()
            rows, made = self._make_known(text_of, self._threads.closed)
            if made is None or self._threads.closed():
                return rows
            read, read_s, encoded, encode_s, load_s = made
            if encoded or read:
                log.info(
                    "search warm-up: %d texts of %d tools ready in %.1f s: %d read from the "
                    "database in %.2f s, %d encoded in %.1f s on %d threads; %s",
                    len(text_of),
                    tools,
                    time.monotonic() - started,
                    read,
                    read_s,
                    encoded,
                    encode_s,
                    self._threads.encode_threads,
                    "model already loaded" if load_s is None else f"model loaded in {load_s:.1f} s",
                )
        finally:
            with self._lock:
                self._pending.difference_update(text_of)
        if (
            self._store is not None
            and not self._threads.closed()
            and (
                self._last_collection is None
                or time.monotonic() - self._last_collection > COLLECT_INTERVAL_S
            )
        ):
            self.collect()
        return rows

    def _fill_offline(self, text_of: dict[str, str]) -> dict[str, Vectors]:
        """Make these texts' vectors known for `vectors` (`_make_known`): to the end even
        once closed, unlogged, with no collection after."""
        try:
            return self._make_known(text_of, lambda: False)[0]
        finally:
            with self._lock:
                self._pending.difference_update(text_of)

    def _make_known(
        self, text_of: dict[str, str], stopped: Callable[[], bool]
    ) -> tuple[dict[str, Vectors], tuple[int, float, int, float, float | None] | None]:
        """Make these texts' vectors known, and return them: memory, then one batched store
        read, then the encoder chunk by chunk (each chunk re-read from the store first, in
        case another sidecar stored it meanwhile; none once `stopped`), writing what it
        encodes to the store. With them, for the log: (read, its seconds, encoded, its
        seconds, the model's load seconds if it loaded now), or None with no encoder."""
        started = time.monotonic()
        rows = self._cached(list(text_of))
        found = self._read_store([key for key in text_of if key not in rows])
        rows.update(found)
        read, read_s = len(found), time.monotonic() - started
        todo = sorted((key for key in text_of if key not in rows), key=lambda k: len(text_of[k]))
        was_loaded = self._loaded
        if not self.load():
            return rows, None
        load_s = None if was_loaded else self._counters.model_load_seconds
        encoder = self._encoder_or_fail()

        def encode(chunk: list[str]) -> tuple[dict[str, Vectors], int]:
            """The chunk's rows, and how many of them were read from the store (re-read
            first, in case another sidecar stored them meanwhile) rather than encoded."""
            if stopped():
                return {}, 0
            found = self._read_store(chunk)
            todo = [key for key in chunk if key not in found]
            if todo:
                vectors = encoder.encode([text_of[key] for key in todo])
                self._remember(zip(todo, vectors, strict=True), encoded=len(todo))
                self._write_store(todo, vectors)
                return {**found, **dict(zip(todo, vectors, strict=True))}, len(found)
            return found, len(found)

        # Similar lengths together, so the encoder's batches carry little padding; the
        # chunks in random order, so two sidecars warming one listing split it.
        chunks = [todo[i : i + _WARM_CHUNK] for i in range(0, len(todo), _WARM_CHUNK)]
        self._chunk_order.shuffle(chunks)
        encoded, began = 0, time.monotonic()
        for done, from_store in self._threads.map_chunks(encode, chunks):
            rows.update(done)
            read += from_store
            encoded += len(done) - from_store
        return rows, (read, read_s, encoded, time.monotonic() - began, load_s)

    def _write_store(self, keys: list[str], vectors: Vectors) -> None:
        if self._store is None:
            return
        stored = [
            (key, row.astype(_STORED_DTYPE).tobytes())
            for key, row in zip(keys, vectors, strict=True)
        ]
        self._store.write_vectors(self.encoder_id, stored)
        with self._lock:
            self._counters = replace(
                self._counters, vectors_written=self._counters.vectors_written + len(stored)
            )

    def _read_store(self, keys: list[str]) -> dict[str, Vectors]:
        import numpy as np

        if self._store is None or not keys:
            return {}
        rows = {}
        for key, data in self._store.read_vectors(self.encoder_id, keys).items():
            row = np.frombuffer(data, dtype=_STORED_DTYPE).astype(np.float32)
            if row.size and (not self._dimension or row.size == self._dimension):
                rows[key] = row
        self._remember(rows.items(), read=len(rows))
        return rows

    def _encoder_or_fail(self) -> TextEncoder:
        if self._encoder is None:
            raise RuntimeError("no sentence encoder: check load() first")
        return self._encoder

    def _cached(self, keys: Sequence[str]) -> dict[str, Vectors]:
        found = {}
        with self._lock:
            for key in keys:
                row = self._vectors.get(key)
                if row is not None:
                    self._vectors.move_to_end(key)
                    found[key] = row
        return found

    def _remember(
        self, rows: Iterable[tuple[str, Vectors]], encoded: int = 0, read: int = 0
    ) -> None:
        with self._lock:
            before = len(self._vectors)
            for key, row in rows:
                self._dimension = self._dimension or int(row.size)
                self._vectors[key] = row
                self._vectors.move_to_end(key)
            while len(self._vectors) > self._capacity:
                self._vectors.popitem(last=False)
            if encoded or read or len(self._vectors) != before:
                self._version += 1
            self._counters = replace(
                self._counters,
                texts_encoded=self._counters.texts_encoded + encoded,
                vectors_read=self._counters.vectors_read + read,
            )


def content_key(text: str) -> str:
    """The key of a text's vector: BLAKE2b-128 of its UTF-8 bytes, hex."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

"""Sentence vectors of tool texts, kept by content hash, and the background warm-up that
encodes a catalogue listing as soon as it is stored.

This is the one place of search that owns threads and OS calls (the warm-up thread, its
nice value); ranking (:mod:`psych_sidecar.search.ranking`) only reads vectors.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np
import numpy.typing as npt

from psych_sidecar.search.ranking import Vectors, tool_texts

log = logging.getLogger(__name__)

# Texts per warm-up encoding: small enough that closing stops a warm-up within a second.
_WARM_CHUNK = 64


class TextEncoder(Protocol):
    """Texts to sentence vectors (:class:`~psych_sidecar.search.encoder.MiniLmEncoder`)."""

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One unit-length row per text, in order; the same text always gives the same row."""
        ...


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
        # Listings submitted for warm-up and not finished (the backlog metric).
        self._backlog = 0
        self._backlog_lock = threading.Lock()

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
        with self._backlog_lock:
            self._backlog += 1
        return self._warmer.submit(self._warm_one, list(tools))

    def backlog(self) -> int:
        """Listings waiting for or under warm-up encoding."""
        return self._backlog

    def _warm_one(self, tools: list[tuple[str, str]]) -> None:
        try:
            self._warm(tools)
        finally:
            with self._backlog_lock:
                self._backlog -= 1

    def close(self) -> None:
        """Stop warming: queued listings are dropped, the one under way stops at its next
        chunk, so shutting down waits for one chunk at most, never a catalogue's encoding.
        Returns once the warm-up thread has ended: it logs nothing after that."""
        self._closed.set()
        if self._warmer is not None:
            self._warmer.shutdown(wait=True, cancel_futures=True)

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
            if encoded and not self._closed.is_set():
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

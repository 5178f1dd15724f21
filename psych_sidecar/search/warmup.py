"""The warm-up's threads, the one place of search that owns threads and OS calls: the model's
loader thread, the one thread warm-up jobs run on one after another (never a request's), and
the encoding threads a job's chunks run on, these two at the lowest CPU priority. Closing
stops them without waiting for a whole catalogue's encoding.

What a job does (which texts, from memory, the store or the encoder) is
:class:`~psych_sidecar.search.embeddings.ToolEmbeddings`'s; this module only runs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class WarmupThreads:
    """The threads of one :class:`~psych_sidecar.search.embeddings.ToolEmbeddings`, started
    on first use. A job encodes its chunks on `encode_threads` threads (the GIL is released
    in the matrix products, so two threads encode a listing nearly twice as fast on two idle
    cores)."""

    def __init__(self, encode_threads: int = 1) -> None:
        self.encode_threads = max(1, encode_threads)
        self._loader: threading.Thread | None = None
        self._warmer: ThreadPoolExecutor | None = None
        self._encoders: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def closed(self) -> bool:
        return self._closed.is_set()

    def start_loader(self, load: Callable[[], object]) -> None:
        """Run `load` once on a thread of its own, at normal priority, without waiting;
        nothing once closed."""
        with self._lock:
            if self._loader is not None or self._closed.is_set():
                return
            self._loader = threading.Thread(target=load, name="search-model-load", daemon=True)
            self._loader.start()

    def submit(self, job: Callable[[], object]) -> Future[None] | None:
        """Queue `job` for the warm-up thread (its failure is logged); None once closed."""

        def run() -> None:
            try:
                job()
            except Exception:
                log.exception("search warm-up failed; searches stay partial until a later one")

        with self._lock:
            if self._closed.is_set():
                return None
            if self._warmer is None:
                self._warmer = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="search-warmup", initializer=_lowest_priority
                )
            try:
                return self._warmer.submit(run)
            except RuntimeError:  # shut down meanwhile
                return None

    def map_chunks(self, encode: Callable[[list[str]], T], chunks: list[list[str]]) -> Iterator[T]:
        """`encode` of every chunk, on the encoding threads (on the caller's thread when there
        is one, or a single chunk, or once closed); stops early when closing cancels them."""
        pool = None
        if self.encode_threads > 1 and len(chunks) > 1:
            with self._lock:
                if not self._closed.is_set():
                    if self._encoders is None:
                        self._encoders = ThreadPoolExecutor(
                            max_workers=self.encode_threads,
                            thread_name_prefix="search-warmup-encode",
                            initializer=_lowest_priority,
                        )
                    pool = self._encoders
        if pool is None:
            yield from map(encode, chunks)
            return
        try:
            futures = [pool.submit(encode, chunk) for chunk in chunks]
        except RuntimeError:  # shut down meanwhile: closing
            return
        try:
            for future in futures:
                yield future.result()
        except CancelledError:  # closing cancelled the chunks not started
            return
        finally:
            for future in futures:
                future.cancel()

    def close(self, wait: bool = False) -> None:
        """Drop queued jobs and cancel chunks not started; with `wait`, return once the job
        under way and the loader have stopped."""
        self._closed.set()
        with self._lock:
            warmer, encoders, loader = self._warmer, self._encoders, self._loader
        for pool in (encoders, warmer):
            if pool is not None:
                pool.shutdown(wait=wait, cancel_futures=True)
        if wait and loader is not None:
            loader.join()


def _lowest_priority() -> None:
    """Run the calling thread at the lowest CPU priority (nice 19), so a warm-up takes only
    the CPU that requests leave idle. Linux keeps a nice value per thread; elsewhere it is
    per process, so this does nothing there rather than slow the whole sidecar."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)

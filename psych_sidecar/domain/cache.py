"""Bounded caches for values that never change once stored (Runs, Spec versions, resolved
catalogues and their search indexes).

Caching immutable rows is safe even with many sidecars on one database: no other sidecar
can change them, so there is nothing to invalidate. A deleted Run is the exception: the
sidecar that deletes it forgets it (`discard`); another that read it before may still hold
it, so the reads that find nothing where the Run had something ask storage again
(RunService.confirm).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ImmutableCache(Generic[K, V]):
    """Least-recently-used, thread-safe: storage threads and the event loop share it."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            if len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def discard(self, key: K) -> None:
        with self._lock:
            self._entries.pop(key, None)


class ByteBudgetCache(Generic[K, V]):
    """Least-recently-used and thread-safe like ImmutableCache, but bounded by the bytes its
    values take (as `size_of` estimates them), not by their count: one index over a large
    catalogue weighs as much as thousands over small ones. A value larger than the whole
    budget is not kept."""

    def __init__(self, budget_bytes: int, size_of: Callable[[V], int]) -> None:
        self._budget = budget_bytes
        self._size_of = size_of
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """What the kept values weigh now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V) -> None:
        size = self._size_of(value)
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._bytes -= previous[1]
            if size > self._budget:
                return
            self._entries[key] = (value, size)
            self._bytes += size
            while self._bytes > self._budget:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted

    def discard_where(self, unwanted: Callable[[V], bool]) -> int:
        """Forget the values `unwanted` says to; how many were forgotten."""
        with self._lock:
            keys = [key for key, (value, _) in self._entries.items() if unwanted(value)]
            for key in keys:
                _, size = self._entries.pop(key)
                self._bytes -= size
            return len(keys)

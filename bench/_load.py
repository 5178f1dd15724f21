"""A closed-loop load generator for grpc.aio calls, shared by cases."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LoadResult:
    calls: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.calls / self.seconds


async def drive(
    call: Callable[[], Awaitable[object]], *, calls: int, concurrency: int
) -> LoadResult:
    """Make ``calls`` calls with ``concurrency`` in flight at all times.

    Each worker awaits one call, then starts the next, until the shared budget
    is spent. Any call's error propagates (a benchmark never hides failures).
    """
    if calls < 1 or concurrency < 1:
        raise ValueError("calls and concurrency must be >= 1")
    remaining = calls

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await call()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, calls))))
    return LoadResult(calls, time.perf_counter() - start)


def median(values: list[float]) -> float:
    return statistics.median(values)

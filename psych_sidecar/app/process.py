"""Process-wide tuning for `serve`: the allocator, before any thread starts; the garbage
collector (off while the modules load, see psych_sidecar.launch) and the GIL's switch
interval, once the sidecar serves."""

from __future__ import annotations

import asyncio
import gc
import sys

from psych_sidecar.bulk import heap
from psych_sidecar.config import Settings

# See after_start().
_GIL_SWITCH_INTERVAL_SECONDS = 0.001
# See release_kept_memory().
_KEPT_MEMORY_SECONDS = 5.0


def before_threads(settings: Settings) -> None:
    """Called first thing by `serve`: malloc's thresholds are set before any thread starts."""
    heap.reuse_large_blocks(settings.process.large_buffer_reuse_bytes)


def after_start() -> None:
    # What start-up made (modules, the contract's descriptors, schemas, servers, pools) lives
    # as long as the process: kept out of the cyclic collector's sight, a full collection no
    # longer walks ~200k permanent objects. On a busy sidecar one full collection otherwise
    # held the GIL for ~100 ms, stalling the loop. The collector was off until now when the
    # command started it (psych_sidecar.launch): start-up's objects were never collected.
    gc.freeze()
    gc.enable()
    # A thread wanting the GIL waits this long before asking the holder to let go (CPython's
    # default: 5 ms). The event loop answers calls while worker threads convert and store
    # large results; each of its turns may wait once, so 5 ms made a health check 12-17 ms
    # beside 50 MB results landing, 1 ms made it ~8 ms (loop_stall_ratio), for no measurable
    # change in calls/s (rpc_overhead_ratio, resolve_turn_overhead_ratio).
    sys.setswitchinterval(_GIL_SWITCH_INTERVAL_SECONDS)


async def release_kept_memory() -> None:
    """Every few seconds, hand back the free memory malloc keeps (`heap.reuse_large_blocks`),
    unless large results landed meanwhile: a burst of them keeps reusing the same blocks, and
    once it is over the memory goes back within ~10 s rather than staying at the burst's peak.
    Runs until cancelled; does nothing where malloc is not tuned."""
    seen = heap.blocks_left()
    while True:
        await asyncio.sleep(_KEPT_MEMORY_SECONDS)
        landing = heap.blocks_left()
        if landing == seen and not await asyncio.to_thread(heap.release_kept_memory):
            return
        seen = landing

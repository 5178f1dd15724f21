"""The process's malloc: large freed blocks kept for reuse, and blocks left ready for a parse.

Tool results of tens of MB are copied several times on their way to the log, some of the
copies inside one C call that holds the GIL throughout (a JSON parse, an encode). Into pages
fresh from the kernel such a copy is slow — each page faulted in as it is first written — and
every other thread, the event loop's included, waits for it. glibc hands blocks over 32 MiB
back to the kernel as soon as they are freed, so by default every large copy writes into fresh
pages. `serve` has malloc keep them instead (`reuse_large_blocks`), and a parse about to create
strings the size of its input is given a block already in memory (`leave_touched_block`).
"""

from __future__ import annotations

import ctypes
import sys

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# CPython's bytes join releases the GIL while it copies from this total size on
# (Objects/stringlib/join.h, GIL_THRESHOLD); a smaller block is not worth touching ahead.
_UNLOCKED_JOIN_BYTES = 1 << 20
# Room for the object header of whatever takes the block: a str of n characters needs a little
# more than n bytes.
_HEADER_ROOM = 4096

# Freed blocks up to this size stay in malloc's keeping (0: not tuned, blocks go back).
_kept_bytes = 0
# Blocks left ready for a parse so far (see leave_touched_block): whether large results are
# landing, for the caller deciding when to hand kept memory back (release_kept_memory).
_blocks_left = 0


def reuse_large_blocks(limit: int) -> bool:
    """Have glibc's malloc keep freed blocks up to `limit` bytes for reuse (its mmap and trim
    thresholds; by default a block over 32 MiB is mapped fresh and unmapped when freed), in
    one arena, so whichever thread allocates next reuses them rather than each thread keeping
    its own. A 50 MB copy took ~19 ms into fresh pages, ~2 ms into reused ones. Called before
    any thread starts. False where there is nothing to tune (not glibc, or 0)."""
    global _kept_bytes
    if limit == 0 or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl, or no C library by that name
        return False
    tuned = all(
        mallopt(parameter, value)
        for parameter, value in (
            (_M_ARENA_MAX, 1),
            (_M_MMAP_THRESHOLD, limit),
            (_M_TRIM_THRESHOLD, limit),
        )
    )
    _kept_bytes = limit if tuned else 0
    return tuned


def leave_touched_block(data: bytes) -> bool:
    """Copies `data` into a new block a page larger and frees it, so that malloc keeps a block
    of that size whose pages are already in memory, for the next allocation that size to
    take. The copy releases the GIL (a bytes join of megabytes); the parse that follows, which
    creates its strings holding the GIL, then writes into those pages instead of faulting in
    fresh ones: beside the first 50 MB result after a start, the worst health check fell from
    30-41 ms to 10-14 ms. False (nothing done) for a block under a MiB, or one malloc would
    not keep."""
    global _blocks_left
    if not _UNLOCKED_JOIN_BYTES <= len(data) <= _kept_bytes - _HEADER_ROOM:
        return False
    block = b"".join((data, bytes(_HEADER_ROOM)))
    del block
    _blocks_left += 1
    return True


def blocks_left() -> int:
    """How many blocks `leave_touched_block` has left so far (it changes while large results
    land)."""
    return _blocks_left


def release_kept_memory() -> bool:
    """Hand the free memory malloc keeps back to the system (glibc's malloc_trim: the free
    pages of every freed block, anywhere in the heap, not only at its top). Kept blocks
    make the next large copy quick; kept for good, they held a sidecar's private memory near
    its peak (~480 MiB after four 50 MB results, ~230 MiB after a catalogue's encoding). The
    call releases the GIL; cheap when little is free. False where malloc is not tuned."""
    if not _kept_bytes:
        return False
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return True

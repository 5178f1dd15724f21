"""heap.leave_touched_block: the block it frees is the one the next large string takes, its
pages already in memory. Measured as the process's resident memory in a fresh interpreter (the
malloc settings are process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Prints how many bytes the resident set grew while a string the size of `data` was created
# from it, after leave_touched_block(data) — with the malloc settings serve makes (`kept`
# bytes) or without them (0).
_PROBE = """
import sys
from psych_sidecar.bulk import heap

def resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096

heap.reuse_large_blocks(int(sys.argv[1]))
data = b"x" * (48 << 20)
left = heap.leave_touched_block(data)
before = resident()
text = data.decode()
print(int(left), resident() - before)
"""

SIZE = 48 << 20


def _grown(kept: int) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(kept)], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "1", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc and /proc")
def test_the_parse_after_it_writes_into_pages_already_in_memory() -> None:
    left, grown = _grown(256 << 20)
    assert left
    assert grown < SIZE // 8, grown
    # Without the settings the block goes back to the kernel when freed; nothing is left.
    left, grown = _grown(0)
    assert not left
    assert grown > SIZE // 2, grown


def test_a_small_or_unkept_block_is_not_touched() -> None:
    from psych_sidecar.bulk import heap

    assert not heap.leave_touched_block(b"x" * 1000)


# Prints the resident set after a 48 MiB block is freed (kept by malloc), then after
# release_kept_memory, and what release_kept_memory answered.
_RELEASE_PROBE = """
import sys
from psych_sidecar.bulk import heap

def resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096

heap.reuse_large_blocks(int(sys.argv[1]))
data = b"x" * (48 << 20)
del data
kept = resident()
released = heap.release_kept_memory()
print(int(released), kept, resident())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc and /proc")
def test_kept_memory_goes_back_when_released() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _RELEASE_PROBE, str(256 << 20)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    released, kept, after = out[0] == "1", int(out[1]), int(out[2])
    assert released
    assert kept - after > SIZE // 2, (kept, after)
    # Not tuned, malloc gave the block back itself: nothing to release.
    out = subprocess.run(
        [sys.executable, "-c", _RELEASE_PROBE, "0"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "0"

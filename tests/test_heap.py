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

"""The entry point of the `psych-sidecar` command and of `python -m psych_sidecar`.

The cyclic garbage collector is off while the command's modules load and, for `serve`, until
the sidecar serves (`process.after_start` freezes what start-up made, then turns it back on;
the other commands turn it on once their arguments are parsed). Start-up makes hundreds of
thousands of objects that live as long as the process: collecting while they are made finds
almost nothing, and took a sixth of the CPU time of serve's imports.
"""

from __future__ import annotations

import gc


def main() -> int:
    gc.disable()
    from psych_sidecar.cli import main as run

    return run()

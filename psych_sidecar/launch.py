"""The entry point of the `psych-sidecar` command and of `python -m psych_sidecar`.

gRPC's fork support is off unless the environment says otherwise (read when grpc is first
imported, so here): the sidecar never uses gRPC in a forked child (its children exec MCP
servers), and with it on, a child uvloop forks while gRPC's threads run fails one time in
twenty (`app/process.py`, `new_event_loop`).

The cyclic garbage collector is off while the command's modules load and, for `serve`, until
the sidecar serves (`process.after_start` freezes what start-up made, then turns it back on;
the other commands turn it on once their arguments are parsed). Start-up makes hundreds of
thousands of objects that live as long as the process: collecting while they are made finds
almost nothing, and took a sixth of the CPU time of serve's imports.
"""

from __future__ import annotations

import gc
import os


def main() -> int:
    gc.disable()
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    from psych_sidecar.cli import main as run

    return run()

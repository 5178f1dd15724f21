"""The entry point of the `psych-sidecar` command and of `python -m psych_sidecar`.

The cyclic garbage collector is off while the command's modules load and, for `serve`, until
the sidecar serves (`process.after_start` freezes what start-up made, then turns it back on;
the other commands turn it on once their arguments are parsed). Start-up makes hundreds of
thousands of objects that live as long as the process: collecting while they are made finds
almost nothing, and took a sixth of the CPU time of serve's imports.

gRPC core logs through absl at INFO unless told otherwise, and says some things at INFO that
are no news to an operator: "Got goaway [2]" each time a client closes its connection with an
HTTP/2 error code (Node's does, when a host exits). `GRPC_VERBOSITY=ERROR`, set here before
gRPC is loaded unless the environment sets it, keeps its errors and drops the rest
(docs/operations.md, Logs); `GRPC_VERBOSITY=INFO` or `DEBUG` brings them back.
"""

from __future__ import annotations

import gc
import os


def main() -> int:
    gc.disable()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    from psych_sidecar.cli import main as run

    return run()

"""The storage's answers on the event loop (`SqliteNow`) over a LoopConnection, as the
sidecar wires them (`app.graph`)."""

from __future__ import annotations

from psych_sidecar.storage.connections import SqlConnectionStore
from psych_sidecar.storage.log_reads import SqlLogReader
from psych_sidecar.storage.loop_connection import LoopConnection
from psych_sidecar.storage.now import SqliteNow
from psych_sidecar.storage.repository import SqlStore


def storage_now(loop: LoopConnection) -> SqliteNow:
    engine = loop.engine
    return SqliteNow(
        loop,
        store=SqlStore(engine),
        log=SqlLogReader(engine),
        connections=SqlConnectionStore(engine, keys=None),
    )

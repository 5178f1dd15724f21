"""The domain's `StorageNow` over SQLite: the one place that answers storage questions on the
event loop's thread.

The choice is "answer on the event loop when SQLite would not wait, else on a storage
thread", and it is made here, explicitly, per question: each method returns its answer, or
None ("not now": the loop's connection is in use, SQLite would wait for a lock, anything
failed; a write then rolled back), and the domain asks the storage threads for the same thing
(`found = now.x(...)`; `if found is None: found = await off_loop(repository.x, ...)`).

The statements and the decoding of their rows are the repositories' own, the same strings
their worker-thread versions run (`*_now` methods taking the `LoopConnection`); they run on
`loop_connection.LoopConnection`, which never waits. No other storage call may run on the
loop: a pooled connection checked out there fails (`engines.refuse_the_event_loop`).

PostgreSQL has none (every statement is a network round trip): the domain is given None and
goes to the storage threads. Each answer is counted
(`psych_sidecar_loop_storage_attempts_total`): done (answered on the loop) or worker (not
now)."""

from __future__ import annotations

from typing import TypeVar

from psych_sidecar.domain.runlog import (
    AppendedRecord,
    PendingAppend,
    RecordKind,
)
from psych_sidecar.storage.connections import SqlConnectionStore
from psych_sidecar.storage.log_reads import SqlLogReader
from psych_sidecar.storage.loop_connection import LoopConnection
from psych_sidecar.storage.repository import SqlStore
from psych_sidecar.telemetry import metrics

T = TypeVar("T")


class SqliteNow:
    """Implements the domain's StorageNow on the event loop's SQLite connection."""

    def __init__(
        self,
        loop: LoopConnection,
        *,
        store: SqlStore,
        log: SqlLogReader,
        connections: SqlConnectionStore,
    ) -> None:
        self._loop = loop
        self._store = store
        self._log = log
        self._connections = connections

    def turn_start(self, run_id: str) -> int | None:
        return _counted(self._log.latest_of_kind_now(self._loop, run_id, RecordKind.USER_MESSAGE))

    def latest_assistant_sequence(self, run_id: str) -> int | None:
        return _counted(
            self._log.latest_of_kind_now(self._loop, run_id, RecordKind.ASSISTANT_MESSAGE)
        )

    def connection_versions(self, tenant: str) -> dict[str, tuple[int, int]] | None:
        return _counted(self._connections.connection_versions_now(self._loop, tenant))

    def call_unrecorded(self, run_id: str, request_id: str) -> bool:
        unrecorded = self._store.call_unrecorded_now(self._loop, run_id, request_id)
        metrics.record_loop_attempt("done" if unrecorded else "worker")
        return unrecorded

    def append_records(self, append: PendingAppend) -> list[AppendedRecord] | None:
        return _counted(self._store.append_records_now(self._loop, append))


def _counted(answer: T | None) -> T | None:
    metrics.record_loop_attempt("worker" if answer is None else "done")
    return answer

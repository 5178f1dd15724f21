"""What Specs, Runs and reads of the log need from storage. Implemented in storage/; the domain
never sees SQL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from psych_sidecar.domain.runlog.content import ByteRange, PartMeta, RecordSkeleton
from psych_sidecar.domain.runlog.result_outline import CallResultOutline
from psych_sidecar.domain.runlog.runs import (
    AllTenants,
    AppendedRecord,
    ContentPart,
    ListedRun,
    Record,
    RecordedCall,
    RecordKind,
    Run,
    StoredRecord,
)
from psych_sidecar.domain.runlog.specs import PublishedSpec, Spec, ToolGrant

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PendingAppend:
    """One append as storage is given it: the records and the handles of their tool results,
    the request id that answers a retry once, the records' fingerprint a retry is compared by,
    and a tool call's result outline (what a retried call is answered with)."""

    run_id: str
    records: Sequence[Record]
    handles: Sequence[str]
    request_id: str
    fingerprint: str
    call_result: CallResultOutline | None = None


class OffLoop(Protocol):
    """Runs a synchronous call off the event loop, on a thread pool of the API layer's (the
    storage threads, or the CPU threads): how async use cases reach storage, which is
    synchronous."""

    def __call__(self, function: Callable[..., T], *args: Any) -> Awaitable[T]: ...


class SpecRepository(Protocol):
    def insert_spec(self, spec: Spec) -> PublishedSpec:
        """Store a new version, or return the stored one when the same version exists.

        The caller compares content; storage only guarantees one row per (name, version).
        """
        ...

    def get_spec(self, name: str, version: int) -> PublishedSpec | None: ...


class RunRepository(Protocol):
    def insert_run(
        self,
        run_id: str,
        tenant: str,
        spec_name: str,
        spec_version: int,
        tool_restrictions: tuple[ToolGrant, ...],
    ) -> Run: ...

    def get_run(self, run_id: str) -> Run | None: ...

    def list_runs(
        self, tenant: str | AllTenants, after_run_id: str, limit: int, with_activity: bool
    ) -> tuple[list[ListedRun], bool]:
        """The one Run listing: a tenant's Runs (or every tenant's) newest first (create
        time, then id, descending), at most `limit` of them, those after the Run
        `after_run_id` in that order (from the first when empty); and whether more remain.
        Each Run's last activity only `with_activity`: one more lookup per Run."""
        ...

    def tenants(self, limit: int) -> list[str]:
        """Tenants that have Runs, sorted, at most `limit`."""
        ...

    def append_records(self, append: PendingAppend) -> list[AppendedRecord]:
        """Append atomically with gap-free sequences.

        With a request id already used in the Run, stores nothing and raises
        REQUEST_ID_REUSED unless the fingerprint matches, in which case it returns the
        first answer. Raises RUN_NOT_FOUND for an unknown Run. `call_result` (one tool
        result appended under a request id) is kept for `recorded_call`.
        """
        ...

    def recorded_call(self, run_id: str, request_id: str) -> RecordedCall | None:
        """The tool result appended under this request id with a `call_result`, its result
        JSON filled in from the record's parts."""
        ...

    def list_records(
        self,
        run_id: str,
        after_sequence: int,
        kinds: tuple[RecordKind, ...],
        limit: int,
        max_bytes: int,
    ) -> tuple[list[StoredRecord], bool]:
        """Records after a sequence, in order, of the given kinds (all when empty): at most
        `limit`, stopping before `max_bytes` of content is exceeded but always returning at
        least one when any remain; and whether more remain after them."""
        ...


class LogReader(Protocol):
    """Reads of the Run log that fetch only what a caller will send or return."""

    def record_skeletons(self, run_id: str) -> list[RecordSkeleton]:
        """Every record of the Run, in sequence order, without content."""
        ...

    def part_metas(self, run_id: str, sequences: Sequence[int]) -> dict[int, list[PartMeta]]:
        """The parts' shapes of the given records, in part order."""
        ...

    def read_ranges(self, run_id: str, ranges: Sequence[ByteRange]) -> list[bytes]:
        """The bytes of each range, in the order asked; ranges stay within their part."""
        ...

    def record_contents(
        self, run_id: str, sequences: Sequence[int]
    ) -> dict[int, tuple[ContentPart, ...]]:
        """The full content of the given records."""
        ...

    def resolve_handle(self, handle: str) -> tuple[str, int] | None:
        """The (run id, sequence) of the tool result with this handle, if any."""
        ...

    def turn_start(self, run_id: str) -> int:
        """The sequence of the Run's last user message (where the current turn starts), 0
        when there is none."""
        ...

    def latest_assistant_sequence(self, run_id: str) -> int:
        """The sequence of the Run's last assistant message, 0 when there is none."""
        ...

    def latest_compaction_sequence(self, run_id: str) -> int:
        """The sequence of the Run's last compaction record, 0 when there is none."""
        ...

    def turn_of(self, run_id: str, sequence: int) -> int:
        """The turn `sequence` is in: how many user messages are at or before it (0 before
        the first)."""
        ...

    def turn_starts(self, run_id: str, turn: int, count: int) -> list[int]:
        """The sequences of the user messages that start turns `turn` (1 is the first) to
        `turn + count - 1`, those there are, in order."""
        ...

    def record_skeletons_between(
        self, run_id: str, first: int, last: int, limit: int
    ) -> list[RecordSkeleton]:
        """The records with sequences `first` to `last` (both included), in sequence order,
        without content; at most `limit` of them, the first ones."""
        ...


class StorageNow(Protocol):
    """Storage's answers for the event loop's thread, each one now or not at all: a value when
    the database gives it without waiting (for a lock, a connection in use, the network), None
    ("not now") otherwise — also when anything failed, a write then fully rolled back. The
    caller then asks the storage threads (`OffLoop`) for the same thing, whose answer and
    typed errors are the real ones. Domain code chooses explicitly:
    ``found = now.x(...)``, ``if found is None: found = await off_loop(repository.x, ...)``.

    Implemented over SQLite by `storage.now.SqliteNow`; with PostgreSQL there is none (every
    statement is a network round trip), and callers given None go to the storage threads."""

    def turn_start(self, run_id: str) -> int | None:
        """`LogReader.turn_start`, or None when not now."""
        ...

    def latest_assistant_sequence(self, run_id: str) -> int | None:
        """`LogReader.latest_assistant_sequence`, or None when not now."""
        ...

    def connection_versions(self, tenant: str) -> dict[str, tuple[int, int]] | None:
        """`ConnectionRepository.connection_versions`, or None when not now."""
        ...

    def call_unrecorded(self, run_id: str, request_id: str) -> bool:
        """True when it is known now that no tool result was recorded under this request id
        (`RunRepository.recorded_call` would answer None); False when one was, or not now:
        then ask `recorded_call`."""
        ...

    def append_records(self, append: PendingAppend) -> list[AppendedRecord] | None:
        """`RunRepository.append_records` (its typed errors too), or None when not now:
        nothing appended. Meant for small records: values that need streaming are not now."""
        ...

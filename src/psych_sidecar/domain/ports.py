"""What the domain needs from outside: storage, and the sentence encoder of semantic search.

Implementations live in storage/ and psych_sidecar/embedding.py; the domain never sees SQL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from psych_sidecar.domain.runs import AppendedRecord, Record, RecordKind, Run, StoredRecord
from psych_sidecar.domain.specs import PublishedSpec, Spec, ToolGrant


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

    def append_records(
        self,
        run_id: str,
        records: Sequence[Record],
        handles: Sequence[str],
        request_id: str,
        fingerprint: str,
    ) -> list[AppendedRecord]:
        """Append atomically with gap-free sequences.

        With a request id already used in the Run, stores nothing and raises
        REQUEST_ID_REUSED unless the fingerprint matches, in which case it returns the
        first answer. Raises RUN_NOT_FOUND for an unknown Run.
        """
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


class TextEncoder(Protocol):
    """Texts to sentence vectors, for semantic tool search (psych_sidecar/embedding.py)."""

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One unit-length row per text, in order; the same text always gives the same row."""
        ...

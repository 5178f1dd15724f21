"""Use cases over Specs and Runs. Synchronous: the API layer runs them off the event loop."""

from __future__ import annotations

import secrets

from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.errors import (
    SpecVersionExists,
    field_invalid,
    field_required,
    run_not_found,
    spec_not_found,
)
from psych_sidecar.domain.runlog.compaction import (
    check_compaction_in_log,
    latest_compaction,
    split_compaction,
    validate_compaction_record,
)
from psych_sidecar.domain.runlog.paging import decode_token, encode_token, page_size
from psych_sidecar.domain.runlog.ports import (
    LogReader,
    PendingAppend,
    RunRepository,
    SpecRepository,
    StorageNow,
)
from psych_sidecar.domain.runlog.result_outline import CallResultOutline
from psych_sidecar.domain.runlog.runs import (
    AllTenants,
    AppendedRecord,
    ListedRun,
    Record,
    RecordedCall,
    RecordKind,
    Run,
    StoredRecord,
    records_fingerprint,
    validate_record,
    validate_request_id,
)
from psych_sidecar.domain.runlog.specs import (
    PublishedSpec,
    Spec,
    ToolGrant,
    validate_grants,
    validate_name,
    validate_spec,
    validate_version,
)


def new_id(prefix: str) -> str:
    """An opaque, unguessable id: the prefix and 26 lowercase hex characters (104 bits)."""
    return prefix + secrets.token_bytes(16).hex()[:26]


class SpecService:
    def __init__(self, specs: SpecRepository) -> None:
        self._specs = specs

    def publish(self, spec: Spec) -> PublishedSpec:
        validate_spec(spec)
        stored = self._specs.insert_spec(spec)
        if stored.spec.fingerprint() != spec.fingerprint():
            raise SpecVersionExists(
                f"spec {spec.name} version {spec.version} was already published with "
                "different content; versions are immutable",
                spec_name=spec.name,
                spec_version=spec.version,
            )
        return stored

    def get(self, name: str, version: int) -> PublishedSpec:
        validate_name(name, "name")
        validate_version(version, "version")
        stored = self._specs.get_spec(name, version)
        if stored is None:
            raise spec_not_found(name, version)
        return stored


class SpecLookup:
    """Spec versions by name and version, cached: a published version never changes. The one
    Spec cache of a sidecar, shared by resolution, assembly and dispatch."""

    def __init__(self, specs: SpecRepository, capacity: int = 1_000) -> None:
        self._specs = specs
        self._cache = ImmutableCache[tuple[str, int], Spec](capacity)

    def cached(self, name: str, version: int) -> Spec | None:
        """The Spec if this process has already read it; no I/O, safe on the event loop."""
        return self._cache.get((name, version))

    def get(self, name: str, version: int) -> Spec:
        key = (name, version)
        spec = self._cache.get(key)
        if spec is None:
            published = self._specs.get_spec(name, version)
            if published is None:
                raise spec_not_found(name, version)
            spec = published.spec
            self._cache.put(key, spec)
        return spec


class RunService:
    def __init__(
        self,
        specs: SpecRepository,
        *,
        runs: RunRepository,
        cache_size: int = 10_000,
        log: LogReader | None = None,
    ) -> None:
        self._specs = specs
        self._runs = runs
        # Where a compaction record's range is checked against the log (none: not checked,
        # for operator commands that never append).
        self._log = log
        self._cache = ImmutableCache[str, Run](cache_size)

    def create(
        self,
        tenant: str,
        spec_name: str,
        spec_version: int,
        tool_restrictions: tuple[ToolGrant, ...],
    ) -> Run:
        validate_name(tenant, "tenant")
        validate_name(spec_name, "spec_name")
        validate_version(spec_version, "spec_version")
        validate_grants(tool_restrictions, "tool_restrictions")
        if self._specs.get_spec(spec_name, spec_version) is None:
            raise spec_not_found(spec_name, spec_version)
        run = self._runs.insert_run(
            new_id("run_"), tenant, spec_name, spec_version, tool_restrictions
        )
        self._cache.put(run.run_id, run)
        return run

    def cached(self, run_id: str) -> Run | None:
        """The Run if this process has already read it; no I/O, safe on the event loop."""
        return self._cache.get(run_id)

    def forget(self, run_id: str) -> None:
        """Drop a deleted Run from this process's memory (RunDeletion)."""
        self._cache.discard(run_id)

    def confirm(self, run: Run) -> None:
        """Raise RUN_NOT_FOUND if `run`, read before, has been deleted since (by any sidecar):
        asked from storage, not this process's memory. For a read that found nothing where
        the Run would have had something."""
        if self._runs.get_run(run.run_id) is None:
            self.forget(run.run_id)
            raise run_not_found(run.run_id)

    def list_runs(
        self,
        tenant: str | AllTenants,
        requested_page_size: int,
        page_token: str,
        with_activity: bool = False,
    ) -> tuple[list[ListedRun], str]:
        """A page of a tenant's Runs (or, with ALL_TENANTS, of every tenant's), newest first,
        and the next page's token; each Run's last activity too when asked (ListRuns does
        not show it, so does not pay for it)."""
        if isinstance(tenant, str):
            validate_name(tenant, "tenant")
            scope = f"runs/{tenant}"
        else:
            # "*" is no tenant name, so the scopes of the two listings never meet.
            scope = "runs/*"
        size = page_size(requested_page_size)
        position = decode_token(page_token, scope)
        if position is not None and (not isinstance(position, str) or not position):
            raise field_invalid("page_token", "not a token this sidecar issued")
        listed, more = self._runs.list_runs(tenant, position or "", size, with_activity)
        for entry in listed:
            self._cache.put(entry.run.run_id, entry.run)
        token = encode_token(scope, listed[-1].run.run_id) if more and listed else ""
        return listed, token

    def tenants(self, limit: int) -> list[str]:
        """Tenants that have Runs, sorted, at most `limit`."""
        return self._runs.tenants(limit)

    def get(self, run_id: str) -> Run:
        if not run_id:
            raise field_required("run_id")
        run = self._cache.get(run_id) or self._runs.get_run(run_id)
        if run is None:
            raise run_not_found(run_id)
        self._cache.put(run_id, run)
        return run

    def append(
        self,
        run_id: str,
        request_id: str,
        records: tuple[Record, ...],
        call_result_json: bytes | None = None,
    ) -> list[AppendedRecord]:
        """Append records; `call_result_json` (with one tool result and a request id) is
        what a retried tool call is answered with (`recorded_call`), kept as its outline: the
        log holds the rest."""
        pending = self._pending(run_id, request_id, records, call_result_json)
        if records[0].kind is RecordKind.COMPACTION:
            self._check_compaction(run_id, records[0])
        return self._runs.append_records(pending)

    def _check_compaction(self, run_id: str, record: Record) -> None:
        """A compaction's range against the log as it is now (see check_compaction_in_log)."""
        if self._log is None:
            return
        self.get(run_id)  # RUN_NOT_FOUND before anything else
        skeletons = self._log.record_skeletons(run_id)
        latest = latest_compaction(skeletons)
        previous = None
        if latest is not None:
            content = self._log.record_contents(run_id, [latest.sequence])[latest.sequence]
            previous = split_compaction(content)[1]
        check_compaction_in_log(
            split_compaction(record.content)[1], previous, skeletons, "records[0]"
        )

    def append_now(
        self,
        now: StorageNow,
        run_id: str,
        request_id: str,
        records: tuple[Record, ...],
        call_result_json: bytes | None = None,
    ) -> list[AppendedRecord] | None:
        """`append` on the event loop's thread, or None when the storage would wait (nothing
        appended: ask `append` on a storage thread)."""
        return now.append_records(self._pending(run_id, request_id, records, call_result_json))

    @staticmethod
    def _pending(
        run_id: str,
        request_id: str,
        records: tuple[Record, ...],
        call_result_json: bytes | None,
    ) -> PendingAppend:
        """The checked append the repository is given: new handles for tool results, the
        records' fingerprint, a call result's outline."""
        if not run_id:
            raise field_required("run_id")
        validate_request_id(request_id)
        if not records:
            raise field_required("records")
        for index, record in enumerate(records):
            validate_record(record, f"records[{index}]")
            if record.kind is RecordKind.COMPACTION:
                if len(records) > 1:
                    raise field_invalid("records", "a compaction record is appended alone")
                validate_compaction_record(record, f"records[{index}]")
        handles = [
            new_id("h_") if record.kind is RecordKind.TOOL_RESULT else "" for record in records
        ]
        outline = (
            None
            if call_result_json is None
            else CallResultOutline.of(call_result_json, records[0].content)
        )
        return PendingAppend(
            run_id, records, handles, request_id, records_fingerprint(records), outline
        )

    def recorded_call(self, run_id: str, request_id: str) -> RecordedCall | None:
        """A tool call's first recorded result, if one was appended under `request_id`."""
        return self._runs.recorded_call(run_id, request_id)

    def list_records(
        self,
        run_id: str,
        kinds: tuple[RecordKind, ...],
        requested_page_size: int,
        page_token: str,
        max_bytes: int,
    ) -> tuple[list[StoredRecord], str]:
        if not run_id:
            raise field_required("run_id")
        limit = page_size(requested_page_size)
        scope = run_id + "|" + ",".join(sorted(kind.value for kind in set(kinds)))
        after = decode_token(page_token, scope)
        run = self.get(run_id)
        records, more = self._runs.list_records(
            run_id, after if isinstance(after, int) else 0, kinds, limit, max_bytes
        )
        if not records:
            # The Run may have been read here before another sidecar deleted it.
            self.confirm(run)
        return records, encode_token(scope, records[-1].sequence) if more else ""

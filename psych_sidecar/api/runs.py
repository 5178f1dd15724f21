"""RunService: create and read Runs, append and list their records."""

from __future__ import annotations

from psych.sidecar.v1 import run_service_pb2, run_service_pb2_grpc
from psych_sidecar.api import convert
from psych_sidecar.api.convert import RESPONSE_HEADROOM_BYTES
from psych_sidecar.api.plumbing import Blocking, Context, Serialized
from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.runlog import (
    PartKind,
    RecordKind,
    Run,
    RunDeletion,
    RunService,
    split_compaction,
)
from psych_sidecar.telemetry import metrics


class RunServicer(run_service_pb2_grpc.RunServiceServicer):
    """GetRun answers with bytes it serialized before (`Serialized`), which the generated
    base's return type does not allow: that method's override is exempt from mypy's check."""

    def __init__(
        self,
        *,
        runs: RunService,
        deletion: RunDeletion,
        blocking: Blocking,
        max_message_bytes: int,
        response_cache_size: int = 10_000,
    ) -> None:
        self._runs = runs
        self._deletion = deletion
        self._blocking = blocking
        self._page_bytes = max(max_message_bytes - RESPONSE_HEADROOM_BYTES, 1)
        self._responses = ImmutableCache[str, tuple[Run, Serialized]](response_cache_size)

    async def CreateRun(
        self, request: run_service_pb2.CreateRunRequest, context: Context
    ) -> run_service_pb2.CreateRunResponse:
        run = await self._blocking(
            self._runs.create,
            request.tenant,
            request.spec_name,
            request.spec_version,
            convert.grants_from_proto(list(request.tool_restrictions)),
        )
        return run_service_pb2.CreateRunResponse(run=convert.run_to_proto(run))

    async def GetRun(  # type: ignore[override]
        self, request: run_service_pb2.GetRunRequest, context: Context
    ) -> Serialized:
        # A Run never changes, so one this process has read is answered without a thread hop,
        # with the response built and encoded for it before.
        run = self._runs.cached(request.run_id)
        if run is None:
            run = await self._blocking(self._runs.get, request.run_id)
        else:
            built = self._responses.get(run.run_id)
            if built is not None and built[0] is run:
                return built[1]
        response = run_service_pb2.GetRunResponse(run=convert.run_to_proto(run))
        encoded = Serialized(response.SerializeToString())
        self._responses.put(run.run_id, (run, encoded))
        return encoded

    async def AppendRecords(
        self, request: run_service_pb2.AppendRecordsRequest, context: Context
    ) -> run_service_pb2.AppendRecordsResponse:
        records = tuple(
            convert.record_from_proto(record, f"records[{index}]")
            for index, record in enumerate(request.records)
        )
        appended = await self._blocking(
            self._runs.append, request.run_id, request.request_id, records
        )
        if records and records[0].kind is RecordKind.COMPACTION:
            summary, covered = split_compaction(records[0].content)
            metrics.record_compaction(
                covered.last_sequence - covered.first_sequence + 1,
                sum(len(p.data) for p in summary if p.kind is PartKind.TEXT),
            )
        return run_service_pb2.AppendRecordsResponse(
            records=[
                run_service_pb2.AppendedRecord(sequence=entry.sequence, handle=entry.handle)
                for entry in appended
            ]
        )

    async def ListRecords(
        self, request: run_service_pb2.ListRecordsRequest, context: Context
    ) -> run_service_pb2.ListRecordsResponse:
        records, next_token = await self._blocking(
            self._runs.list_records,
            request.run_id,
            convert.record_kinds_from_proto(list(request.kinds)),
            request.page_size,
            request.page_token,
            self._page_bytes,
        )
        return run_service_pb2.ListRecordsResponse(
            records=[convert.record_to_proto(record) for record in records],
            next_page_token=next_token,
        )

    async def ListRuns(
        self, request: run_service_pb2.ListRunsRequest, context: Context
    ) -> run_service_pb2.ListRunsResponse:
        runs, next_token = await self._blocking(
            self._runs.list_runs, request.tenant, request.page_size, request.page_token
        )
        return run_service_pb2.ListRunsResponse(
            runs=[convert.run_to_proto(listed.run) for listed in runs], next_page_token=next_token
        )

    async def DeleteRun(
        self, request: run_service_pb2.DeleteRunRequest, context: Context
    ) -> run_service_pb2.DeleteRunResponse:
        self._responses.discard(request.run_id)
        await self._blocking(self._deletion.delete, request.run_id)
        self._responses.discard(request.run_id)
        return run_service_pb2.DeleteRunResponse()

"""Servicers: protobuf in, domain call (off the event loop), protobuf out.

RPCs whose behaviour belongs to a later release are simply not overridden here; the
server registers those as UNIMPLEMENTED with a NOT_IMPLEMENTED ErrorInfo.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from psych.sidecar.v1 import (
    run_service_pb2,
    run_service_pb2_grpc,
    spec_service_pb2,
    spec_service_pb2_grpc,
)
from psych_sidecar.api import convert
from psych_sidecar.api.convert import RESPONSE_HEADROOM_BYTES
from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.errors import field_required
from psych_sidecar.domain.runlog import Run, RunService, SpecService
from psych_sidecar.telemetry import metrics

T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True, slots=True)
class Serialized:
    """A response a servicer has already serialized, on a worker thread: encoding a response
    of tens of MB takes tens of milliseconds, which the event loop must not spend (the
    server's serializer passes these bytes through, `serialize_response`)."""

    data: bytes


def serialize_response(response: Message | Serialized) -> bytes:
    """A response's wire bytes: a message is serialized here (on the event loop), a
    Serialized one is already."""
    if isinstance(response, Serialized):
        return response.data
    return response.SerializeToString()


class Blocking:
    """Runs synchronous domain calls on the storage thread pool, in the caller's context
    (its span and log fields), recording how long each waited for a thread.

    The hop is `loop.run_in_executor`'s minus its second future: the worker settles the
    awaited asyncio future itself (one `call_soon_threadsafe`), rather than a
    concurrent.futures future chained to an asyncio one by callbacks both ways. A call
    cancelled before a worker took it does not run, as with run_in_executor."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    async def __call__(self, function: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        context = contextvars.copy_context()
        submitted = time.perf_counter()

        def run() -> None:
            metrics.observe(metrics.STORAGE_WAIT_SECONDS, time.perf_counter() - submitted)
            try:
                result = context.run(function, *args)
            except BaseException as error:
                _settle_soon(loop, future, None, error)
            else:
                _settle_soon(loop, future, result, None)

        work = self._executor.submit(run)
        try:
            return await future
        except asyncio.CancelledError:
            work.cancel()
            raise


def _settle_soon(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[T],
    result: T | None,
    error: BaseException | None,
) -> None:
    """From a worker thread: settle `future` on its loop (unless the loop is gone: nobody
    awaits it any more)."""
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:
        if not loop.is_closed():
            raise


def _settle(future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


class SpecServicer(spec_service_pb2_grpc.SpecServiceServicer):
    def __init__(self, specs: SpecService, blocking: Blocking) -> None:
        self._specs = specs
        self._blocking = blocking

    async def PublishSpec(
        self, request: spec_service_pb2.PublishSpecRequest, context: Context
    ) -> spec_service_pb2.PublishSpecResponse:
        if not request.HasField("spec"):
            raise field_required("spec")
        published = await self._blocking(self._specs.publish, convert.spec_from_proto(request.spec))
        return spec_service_pb2.PublishSpecResponse(spec=convert.spec_to_proto(published))

    async def GetSpec(
        self, request: spec_service_pb2.GetSpecRequest, context: Context
    ) -> spec_service_pb2.GetSpecResponse:
        published = await self._blocking(self._specs.get, request.name, request.version)
        return spec_service_pb2.GetSpecResponse(spec=convert.spec_to_proto(published))


class RunServicer(run_service_pb2_grpc.RunServiceServicer):
    def __init__(
        self,
        runs: RunService,
        blocking: Blocking,
        max_message_bytes: int,
        response_cache_size: int = 10_000,
    ) -> None:
        self._runs = runs
        self._blocking = blocking
        self._page_bytes = max(max_message_bytes - RESPONSE_HEADROOM_BYTES, 1)
        self._responses = ImmutableCache[str, tuple[Run, run_service_pb2.GetRunResponse]](
            response_cache_size
        )

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

    async def GetRun(
        self, request: run_service_pb2.GetRunRequest, context: Context
    ) -> run_service_pb2.GetRunResponse:
        # A Run never changes, so one this process has read is answered without a thread hop,
        # with the response built for it before (responses are never mutated once built).
        run = self._runs.cached(request.run_id)
        if run is None:
            run = await self._blocking(self._runs.get, request.run_id)
        else:
            built = self._responses.get(run.run_id)
            if built is not None and built[0] is run:
                return built[1]
        response = run_service_pb2.GetRunResponse(run=convert.run_to_proto(run))
        self._responses.put(run.run_id, (run, response))
        return response

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

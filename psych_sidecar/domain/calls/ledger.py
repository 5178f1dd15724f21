"""Every tool call the sidecar runs runs once per (Run, assistant step, call id), and its
result is recorded in the Run's log before the call returns: a retry — after a lost response,
concurrent or later, on this sidecar or another on the same database — gets the recorded
answer, and the tool does not run again."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TypeVar

from psych_sidecar.domain.calls.limits import MAX_RESULT_BYTES_APPENDED_ON_LOOP
from psych_sidecar.domain.calls.results import ToolOutcome, ToolResult
from psych_sidecar.domain.errors import Reason, SidecarError
from psych_sidecar.domain.runlog import (
    LogReader,
    Record,
    RecordedCall,
    RecordKind,
    RunBlocking,
    RunService,
)
from psych_sidecar.domain.surface import RunContext

Prepared = TypeVar("Prepared")


ReadScope = Callable[[], AbstractContextManager[object]]
"""Makes the database reads inside its block one transaction (the storage's `shared_reads`)."""


class CallLedger:
    def __init__(
        self,
        runs: RunService,
        log: LogReader,
        blocking: RunBlocking,
        one_read: ReadScope = contextlib.nullcontext,
        loop_first: RunBlocking | None = None,
    ) -> None:
        self._runs = runs
        self._log = log
        self._blocking = blocking
        # A call's reads and a small result's append: tried on the event loop's thread first
        # (`domain.runlog.loop_attempts`), when the storage offers it.
        self._loop_first = loop_first or blocking
        self._one_read = one_read
        # Calls being executed, by (run, call id): a duplicate arriving meanwhile (a retry
        # after a lost response) waits for the first and gets its answer.
        self._in_flight: dict[tuple[str, str], asyncio.Task[ToolOutcome]] = {}

    async def once(
        self, context: RunContext, call_id: str, run: Callable[[], Awaitable[ToolResult]]
    ) -> ToolOutcome:
        """The recorded outcome of this call: `run`'s result, recorded, the first time; the
        first time's answer after that."""
        return await self.prepared_once(
            context.run.run_id, call_id, lambda: None, lambda _prepared: run()
        )

    async def prepared_once(
        self,
        run_id: str,
        call_id: str,
        prepare: Callable[[], Prepared],
        run: Callable[[Prepared], Awaitable[ToolResult]],
    ) -> ToolOutcome:
        """`once`, with `prepare` (a read of the database the call needs, such as the Run's
        resolved turn) run on the storage threads in the same hop as the look-up of a
        recorded answer, and its value handed to `run`: one hop less per call."""
        key = (run_id, call_id)
        task = self._in_flight.get(key)
        if task is None:
            # Not tied to this RPC: a call whose client gave up (a deadline) still finishes
            # and records its result, which the client's retry then finds.
            task = asyncio.ensure_future(self._run_once(run_id, call_id, prepare, run))
            self._in_flight[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        return await asyncio.shield(task)

    def _finished(self, key: tuple[str, str], task: asyncio.Task[ToolOutcome]) -> None:
        if self._in_flight.get(key) is task:
            del self._in_flight[key]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have gone

    async def _run_once(
        self,
        run_id: str,
        call_id: str,
        prepare: Callable[[], Prepared],
        run: Callable[[Prepared], Awaitable[ToolResult]],
    ) -> ToolOutcome:
        prepared, request_id, recorded = await self._loop_first(
            self._prepared_and_recorded, run_id, call_id, prepare
        )
        if recorded is not None:
            return ToolOutcome.of(recorded)
        result = await run(prepared)
        try:
            return await self._record(run_id, call_id, result, request_id)
        except SidecarError as error:
            if error.reason is not Reason.REQUEST_ID_REUSED:
                raise
            # Another sidecar ran the same call meanwhile and recorded first: its answer
            # stands (this result is not recorded).
            _, recorded = await self._blocking(self._recorded, run_id, call_id)
            if recorded is None:
                raise
            return ToolOutcome.of(recorded)

    def _prepared_and_recorded(
        self, run_id: str, call_id: str, prepare: Callable[[], Prepared]
    ) -> tuple[Prepared, str, RecordedCall | None]:
        with self._one_read():
            prepared = prepare()
            return (prepared, *self._recorded(run_id, call_id))

    def _recorded(self, run_id: str, call_id: str) -> tuple[str, RecordedCall | None]:
        """The request id naming this call in its assistant step, and its recorded result."""
        step = self._log.latest_assistant_sequence(run_id)
        digest = hashlib.sha256(f"{step}\x00{call_id}".encode()).hexdigest()
        request_id = f"call-{digest[:48]}"
        return request_id, self._runs.recorded_call(run_id, request_id)

    async def _record(
        self, run_id: str, call_id: str, result: ToolResult, request_id: str
    ) -> ToolOutcome:
        record = Record(
            RecordKind.TOOL_RESULT,
            content=result.content,
            call_id=call_id,
            server=result.server,
            tool=result.tool,
            is_error=result.is_error,
        )
        small = len(result.result_json) <= MAX_RESULT_BYTES_APPENDED_ON_LOOP
        (appended,) = await (self._loop_first if small else self._blocking)(
            self._runs.append, run_id, request_id, (record,), result.result_json
        )
        return ToolOutcome(result.is_error, result.result_json, appended.sequence, appended.handle)

"""Every tool call the sidecar runs runs once per (Run, assistant step, call id), and its
result is recorded in the Run's log before the call returns: a retry — after a lost response,
concurrent or later, on this sidecar or another on the same database — gets the recorded
answer, and the tool does not run again.

A call whose server asks for input first is not recorded yet: its round of questions is stored
(`InputWaits`) and the host gets a `WaitingCall`; a retry of the call gets the same while the
round waits. The call ends when it is continued with the answers (`continuation.py`) or when
the round expires (a tool error saying nobody answered, recorded like any result)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from psych_sidecar.domain.calls.limits import MAX_RESULT_BYTES_APPENDED_ON_LOOP
from psych_sidecar.domain.calls.outcomes import (
    Asking,
    CallOutcome,
    CallResult,
    ToolOutcome,
    ToolResult,
    WaitingCall,
)
from psych_sidecar.domain.canonical import canonical_json, sorted_keys
from psych_sidecar.domain.catalog import (
    CallRounds,
    InputWait,
    InputWaits,
    RoundOutcome,
    new_attempt,
)
from psych_sidecar.domain.errors import Reason, SidecarError
from psych_sidecar.domain.runlog import (
    LogReader,
    OffLoop,
    Record,
    RecordedCall,
    RecordKind,
    RunService,
    StorageNow,
)
from psych_sidecar.domain.surface import RunContext

Prepared = TypeVar("Prepared")
Answered = TypeVar("Answered")


@dataclass(eq=False, kw_only=True, slots=True)
class CallLedger:
    runs: RunService
    log: LogReader
    off_loop: OffLoop
    # A call's reads and a small result's append are asked of the storage on the event
    # loop's thread first (SQLite), then of the storage threads when it says not now.
    now: StorageNow | None = None
    # Rounds of questions of calls waiting for input (None: every call that asks fails
    # as a tool error, as with no host to answer).
    waits: InputWaits | None = None
    input_wait_seconds: float = 600.0
    # Calls being executed, by (run, call id): a duplicate arriving meanwhile (a retry
    # after a lost response) waits for the first and gets its answer.
    _in_flight: dict[tuple[str, ...], _Flight] = field(default_factory=dict, init=False)

    async def once(
        self, context: RunContext, call_id: str, run: Callable[[], Awaitable[CallResult]]
    ) -> CallOutcome:
        """The recorded outcome of this call: `run`'s result, recorded, the first time; the
        first time's answer after that."""
        return await self.prepared_once(
            context.run.run_id, call_id, _nothing, _nothing, lambda _prepared: run()
        )

    async def prepared_once(
        self,
        run_id: str,
        call_id: str,
        prepare_now: Callable[[], Prepared | None],
        prepare: Callable[[], Prepared],
        run: Callable[[Prepared], Awaitable[CallResult]],
    ) -> CallOutcome:
        """`once`, with a read of the database the call needs (such as the Run's resolved
        turn) made with the look-up of a recorded answer, and its value handed to `run`:
        `prepare_now` on the event loop's thread (None: not now), else `prepare` on the
        storage threads in the same hop as the look-up, one hop less per call."""

        async def run_once() -> CallOutcome:
            found = self._unrecorded_now(run_id, call_id, prepare_now)
            if found is None:
                prepared, request_id, recorded, rounds = await self.off_loop(
                    self._prepared_and_recorded, run_id, call_id, prepare
                )
                if recorded is not None:
                    return ToolOutcome.of(recorded)
                if rounds is not None:
                    # A retry of a call that waits for input: the same questions. (One whose
                    # answer is being given gets its last round too; the tool does not run
                    # again.)
                    if rounds.ended:
                        return WaitingCall.of(rounds.latest)
                    return await self.waiting_or_expired(rounds.latest)
            else:
                prepared, request_id = found
            return await self.settle(run_id, call_id, request_id, await run(prepared), 1)

        return await self.single((run_id, call_id), run_once)

    async def single(
        self, key: tuple[str, ...], run_once: Callable[[], Awaitable[Answered]]
    ) -> Answered:
        """`run_once` run once for all who ask with `key` meanwhile."""
        flight = self._in_flight.get(key)
        if flight is None:
            # Not tied to this RPC: a call whose client gave up (a deadline) still finishes
            # and records its result, which the client's retry then finds.
            flight = self._in_flight[key] = _Flight(key)
            flight.task = asyncio.ensure_future(self._fly(flight, run_once))
        # Each asker waits on a future of its own: one that goes away (its RPC cancelled)
        # cancels only that future, never the call.
        answer: asyncio.Future[Answered] = asyncio.get_running_loop().create_future()
        flight.waiters.append(answer)
        return await answer

    async def _fly(self, flight: _Flight, run_once: Callable[[], Awaitable[Any]]) -> None:
        """`run_once`, its outcome handed to every asker still waiting by this task itself:
        an asker wakes at the event loop's next turn. (Awaiting the task through
        `asyncio.shield` took a turn more per call: the task's done callbacks, then the
        shield's.)"""
        try:
            answer = await run_once()
        except BaseException as error:
            self._landed(flight)
            for waiter in flight.waiters:
                if waiter.done():
                    continue
                if isinstance(error, asyncio.CancelledError):
                    waiter.cancel()
                else:
                    waiter.set_exception(error)
                    waiter.exception()  # retrieved: its asker may be gone before it wakes
            if not isinstance(error, Exception):
                raise
            return
        self._landed(flight)
        for waiter in flight.waiters:
            if not waiter.done():
                waiter.set_result(answer)

    def _landed(self, flight: _Flight) -> None:
        if self._in_flight.get(flight.key) is flight:
            del self._in_flight[flight.key]

    def _unrecorded_now(
        self, run_id: str, call_id: str, prepare_now: Callable[[], Prepared | None]
    ) -> tuple[Prepared, str] | None:
        """On the event loop: the prepared value and the call's request id when the call is
        known now to have no recorded answer; None otherwise (not now, or an answer to read)."""
        if self.now is None:
            return None
        prepared = prepare_now()
        if prepared is None:
            return None
        step = self.now.latest_assistant_sequence(run_id)
        if step is None:
            return None
        request_id = _request_id(step, call_id)
        if not self.now.call_unrecorded(run_id, request_id):
            return None
        return prepared, request_id

    def _prepared_and_recorded(
        self, run_id: str, call_id: str, prepare: Callable[[], Prepared]
    ) -> tuple[Prepared, str, RecordedCall | None, CallRounds | None]:
        prepared = prepare()
        request_id, recorded = self._recorded(run_id, call_id)
        rounds = None
        if recorded is None and self.waits is not None:
            rounds = self.waits.latest_round(run_id, request_id)
        return prepared, request_id, recorded, rounds

    async def settle(
        self, run_id: str, call_id: str, request_id: str, result: CallResult, round_number: int
    ) -> CallOutcome:
        """A result recorded; questions stored as the call's round `round_number`."""
        if isinstance(result, ToolResult):
            return await self._record(run_id, call_id, result, request_id)
        if self.waits is None:
            return await self._record(run_id, call_id, _unasked(result), request_id)
        now = datetime.now(UTC)
        wait = InputWait(
            run_id=run_id,
            request_id=request_id,
            round=round_number,
            call_id=call_id,
            server=result.server,
            tool=result.tool,
            attempt=new_attempt(round_number),
            arguments_json=canonical_json(sorted_keys(result.arguments)).decode(),
            asked=result.asked,
            create_time=now,
            expire_time=now + timedelta(seconds=self.input_wait_seconds),
        )
        await self.off_loop(self.waits.add_round, wait)
        return WaitingCall.of(wait)

    async def waiting_or_expired(self, wait: InputWait) -> CallOutcome:
        """The round as the host gets it while it waits; once expired, the call ends as a
        tool error saying nobody answered, recorded (and the round marked expired)."""
        if datetime.now(UTC) < wait.expire_time or self.waits is None:
            return WaitingCall.of(wait)
        if not await self.off_loop(self.waits.end_round, wait, RoundOutcome.EXPIRED, ()):
            recorded = await self.off_loop(self.recorded_of, wait)
            if recorded is not None:
                return ToolOutcome.of(recorded)
        return await self._record(
            wait.run_id,
            wait.call_id,
            expired_result(wait, self.input_wait_seconds),
            wait.request_id,
        )

    def recorded_of(self, wait: InputWait) -> RecordedCall | None:
        """The recorded result of the waiting call's request, once it ended."""
        return self.runs.recorded_call(wait.run_id, wait.request_id)

    def _recorded(self, run_id: str, call_id: str) -> tuple[str, RecordedCall | None]:
        """The request id naming this call in its assistant step, and its recorded result."""
        request_id = _request_id(self.log.latest_assistant_sequence(run_id), call_id)
        return request_id, self.runs.recorded_call(run_id, request_id)

    async def _record(
        self, run_id: str, call_id: str, result: ToolResult, request_id: str
    ) -> ToolOutcome:
        try:
            return await self._append(run_id, call_id, result, request_id)
        except SidecarError as error:
            if error.reason is not Reason.REQUEST_ID_REUSED:
                raise
            # Another sidecar ran the same call meanwhile and recorded first: its answer
            # stands (this result is not recorded).
            _, recorded = await self.off_loop(self._recorded, run_id, call_id)
            if recorded is None:
                raise
            return ToolOutcome.of(recorded)

    async def _append(
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
        arguments = (run_id, request_id, (record,), result.result_json)
        found = (
            self.runs.append_now(self.now, *arguments)
            if self.now is not None and len(result.result_json) <= MAX_RESULT_BYTES_APPENDED_ON_LOOP
            else None
        )
        if found is None:
            found = await self.off_loop(self.runs.append, *arguments)
        (appended,) = found
        return ToolOutcome(
            result.is_error,
            result.result_json,
            appended.sequence,
            appended.handle,
            result.authorization,
            result.task,
        )


@dataclass(eq=False, slots=True)
class _Flight:
    """One call being executed (`CallLedger.single`): its task, and the futures of those
    waiting for its answer."""

    key: tuple[str, ...]
    waiters: list[asyncio.Future[Any]] = field(default_factory=list)
    # Kept here: the event loop holds its tasks weakly.
    task: asyncio.Future[None] | None = None


def expired_result(wait: InputWait, wait_seconds: float) -> ToolResult:
    """What the model gets when nobody answered a call's question in time."""
    question = wait.asked.requests[0].message if wait.asked.requests else "its question"
    return ToolResult.error(
        f"{wait.server}/{wait.tool} asked the user for input ({_cut(question)}) and nobody "
        f"answered within {wait_seconds:g} seconds, so it did not run to the end. Call it "
        "again to ask again, or go on without it.",
        wait.server,
        wait.tool,
    )


def _unasked(asking: Asking) -> ToolResult:
    return ToolResult.error(
        f"{asking.server}/{asking.tool} asked for the user's input, which cannot be given "
        "here; nothing more was done.",
        asking.server,
        asking.tool,
    )


def _cut(text: str, limit: int = 80) -> str:
    one_line = " ".join(text.split())
    return json.dumps(one_line if len(one_line) <= limit else one_line[: limit - 1] + "…")


def _request_id(step: int, call_id: str) -> str:
    """The request id naming a call in its assistant step (the sequence of its message)."""
    digest = hashlib.sha256(f"{step}\x00{call_id}".encode()).hexdigest()
    return f"call-{digest[:48]}"


def _nothing() -> tuple[()]:
    """The prepared value of a call that needs none."""
    return ()

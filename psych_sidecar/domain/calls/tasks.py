"""Tool calls that run as tasks on their MCP server (the MCP tasks extension,
`io.modelcontextprotocol/tasks`).

A call the host marks long-running, or whose tool declares itself so, is offered to its server
as a task; a server that takes it answers at once with a task handle. The model's view: the
call's result, recorded now, says the call started and is running; when the task ends, its
result is appended to the Run's log as a later step of its own (an assistant step calling
`mcp_task_result` for the call, and that step's tool result), so nothing already in the log —
and so no prompt prefix — changes.

The task is stored (`TaskRepository`): every sidecar on the database polls the tasks that are
due, each claiming one by moving its next poll forward before asking the server, so a task
outlives the sidecar that started it and is polled by one sidecar at a time. Polls back off
from `TaskTimings.first_poll` to `max_poll`, never sooner than the server's `pollIntervalMs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from psych_sidecar.domain.calls.outcomes import ToolResult
from psych_sidecar.domain.calls.task_input import TaskQuestions, unanswered_text
from psych_sidecar.domain.calls.task_types import (
    CallExecution,
    StartedTask,
    TaskReport,
    TaskState,
    ToolTask,
    result_call_id,
)
from psych_sidecar.domain.catalog import (
    InputAnswer,
    InputAsked,
    InputWait,
    McpToolRequest,
    McpToolResult,
    ToolCallFailed,
)
from psych_sidecar.domain.errors import Reason, SidecarError, tool_task_not_found
from psych_sidecar.domain.runlog import (
    ContentPart,
    LogReader,
    OffLoop,
    Record,
    RecordKind,
    RunService,
    ToolCall,
)
from psych_sidecar.domain.surface import naming

log = logging.getLogger(__name__)

# The sidecar's tool the appended step calls: never on a surface, only in the log.
TASK_RESULT_TOOL = naming.TASK_RESULT


class TaskRunner(Protocol):
    """What tasks need of the MCP layer. Raises ToolCallFailed when the server could not be
    asked (unreachable, timed out)."""

    async def start_tool(
        self, request: McpToolRequest, timeout_seconds: float, execution: CallExecution
    ) -> McpToolResult | StartedTask | InputAsked:
        """The call, offered as a task when `execution` or the tool asks and the server
        supports tasks; its result when the server answered at once, or its questions when
        a call not run as a task asked for input first."""
        ...

    async def poll_task(
        self, tenant: str, server: str, tool: str, task_id: str, timeout_seconds: float
    ) -> TaskReport:
        """Where the task is; once completed, its result converted as the call's would be."""
        ...

    async def cancel_task(
        self, tenant: str, server: str, task_id: str, timeout_seconds: float
    ) -> None: ...

    async def answer_task(
        self,
        tenant: str,
        server: str,
        task_id: str,
        *,
        asked: InputAsked,
        answers: Sequence[InputAnswer],
        timeout_seconds: float,
    ) -> None:
        """The answers to the task's questions, delivered (`tasks/update`)."""
        ...


class TaskRepository(Protocol):
    """Stored tasks. Times are seconds since the epoch (the storage's clock)."""

    def insert_task(self, task: ToolTask, next_poll: float) -> None:
        """Store a new task (a second insert of the same call keeps the first)."""
        ...

    def get_task(self, run_id: str, call_id: str) -> ToolTask | None: ...

    def claim_due(self, lease_seconds: float, limit: int) -> list[ToolTask]:
        """Tasks not ended whose next poll is due, each claimed by moving its next poll
        `lease_seconds` ahead (a task another sidecar claimed first is left out)."""
        ...

    def reschedule(self, task: ToolTask, next_poll: float) -> None:
        """Store what a poll learnt (state, message, polls, interval) and the next poll."""
        ...

    def end_task(self, task: ToolTask) -> ToolTask | None:
        """Store an ended task with where its result is; None when it had ended already."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskTimings:
    # The first poll after a task starts, and the longest wait between two.
    first_poll: float = 1.0
    max_poll: float = 60.0
    # How often the sidecar looks for due tasks, and how long a claim holds.
    tick: float = 0.5
    lease: float = 60.0
    # How long one request to the server (a poll, a cancel) may take.
    request_timeout: float = 30.0
    # At most this many tasks are polled per look.
    batch: int = 50


def started_text(server: str, tool: str, call_id: str) -> str:
    return (
        f"{server}/{tool} started and is running as a task on its server. Its result will "
        f"come in a later step, as the result of {TASK_RESULT_TOOL} for call {call_id!r}; "
        "nothing needs to be called meanwhile."
    )


def _ended_text(task: ToolTask, detail: str) -> str:
    name = f"{task.server}/{task.tool}"
    if task.state is TaskState.CANCELLED:
        return f"The task of call {task.call_id!r} ({name}) was cancelled by the host."
    return f"The task of call {task.call_id!r} ({name}) failed without a result: {detail}"


@dataclass(eq=False, kw_only=True, slots=True)
class ToolTasks:
    """Starts calls as tasks, polls them, ends them in the log, and answers the host."""

    repository: TaskRepository
    runner: TaskRunner
    runs: RunService
    log_reader: LogReader
    blocking: OffLoop
    timings: TaskTimings
    # Where a task's own questions wait for the host (None: a task that asks stays
    # INPUT_REQUIRED until its server ends it).
    questions: TaskQuestions | None = None
    # Woken when a task starts here, so its first poll is not a whole tick late.
    _started: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    # Starting

    async def start(
        self,
        *,
        run_id: str,
        call_id: str,
        request: McpToolRequest,
        timeout_seconds: float,
        execution: CallExecution,
    ) -> McpToolResult | ToolResult | InputAsked:
        """The call: the server's result when it answered at once (or its questions, when it
        asked for input first), else the started result (the task stored first, so a task
        whose start is recorded is never lost)."""
        answer = await self.runner.start_tool(request, timeout_seconds, execution)
        if not isinstance(answer, StartedTask):
            return answer
        server, tool = request.server, request.tool
        now = time.time()
        task = ToolTask(
            run_id=run_id,
            call_id=call_id,
            tenant=request.tenant,
            server=server,
            tool=tool,
            task_id=answer.task_id,
            state=answer.state,
            status_message=answer.status_message,
            create_time=datetime.fromtimestamp(now, UTC),
            update_time=datetime.fromtimestamp(now, UTC),
            poll_interval_seconds=answer.poll_interval_seconds,
        )
        await self.blocking(self.repository.insert_task, task, now + self._next_wait(task))
        self._started.set()
        started = ToolResult.of((ContentPart.text(started_text(server, tool, call_id)),))
        return replace(started, server=server, tool=tool, task=task)

    # The host's view

    async def get(self, run_id: str, call_id: str) -> ToolTask:
        task = await self.blocking(self.repository.get_task, run_id, call_id)
        if task is None:
            raise tool_task_not_found(run_id, call_id)
        if task.state is TaskState.INPUT_REQUIRED and self.questions is not None:
            waiting = await self.questions.open_round(task)
            if waiting is not None and datetime.now(UTC) < waiting.expire_time:
                return replace(task, waiting=waiting)
        return task

    # A task's own questions (see task_input.py)

    async def answer(
        self, wait: InputWait, answers: Sequence[InputAnswer], timeout_seconds: float
    ) -> ToolTask:
        """The task's round, answered (its outcome stored by the caller): the answers go to
        the server and the task runs on, polled soon."""
        task = await self.get(wait.run_id, wait.call_id)
        if task.state.ended or self.questions is None:
            return task

        async def deliver(
            task: ToolTask, asked: InputAsked, answers: Sequence[InputAnswer]
        ) -> None:
            await self.runner.answer_task(
                task.tenant,
                task.server,
                task.task_id,
                asked=asked,
                answers=answers,
                timeout_seconds=timeout_seconds,
            )

        answered = await self.questions.answer(task, wait, answers, deliver)
        await self.blocking(
            self.repository.reschedule, answered, time.time() + self.timings.first_poll
        )
        self._started.set()
        return answered

    async def expire_round(self, wait: InputWait) -> ToolTask:
        """Nobody answered the task's round in time: the server is asked to cancel the task,
        and it ends as a tool error saying nobody answered (recorded in the log)."""
        task = await self.get(wait.run_id, wait.call_id)
        if self.questions is not None and not task.state.ended:
            await self._expired(task, wait)
        return await self.get(wait.run_id, wait.call_id)

    async def _expired(self, task: ToolTask, wait: InputWait) -> None:
        assert self.questions is not None
        if not await self.questions.expire(wait):
            return  # answered meanwhile
        with contextlib.suppress(ToolCallFailed):
            await self.runner.cancel_task(
                task.tenant, task.server, task.task_id, self.timings.request_timeout
            )
        detail = unanswered_text(wait, self.questions.wait_seconds)
        log.info("task %s of call %s: %s", task.task_id, task.call_id, detail)
        await self._end(replace(task, state=TaskState.FAILED, waiting=None), None, detail)

    async def cancel(self, run_id: str, call_id: str) -> ToolTask:
        """Ask the server to cancel (cooperative: it may not), and end the task for the Run
        at once."""
        task = await self.get(run_id, call_id)
        if task.state.ended:
            return task
        try:
            await self.runner.cancel_task(
                task.tenant, task.server, task.task_id, self.timings.request_timeout
            )
        except ToolCallFailed as error:
            # The Run's task ends anyway; the server forgets it at its TTL.
            log.info("tasks/cancel of %s/%s failed: %s", task.server, task.task_id, error)
        ended = replace(task, state=TaskState.CANCELLED, status_message="cancelled by the host")
        return await self._end(ended, None, "") or await self.get(run_id, call_id)

    # Polling: every sidecar, for every Run on the database

    async def poll_forever(self) -> None:
        """Until cancelled: claim the due tasks and poll each; a failed look is logged and
        the next one tries again."""
        while True:
            try:
                due = await self.blocking(
                    self.repository.claim_due, self.timings.lease, self.timings.batch
                )
                polled = await asyncio.gather(
                    *(self._poll(task) for task in due), return_exceptions=True
                )
                for failure in polled:
                    if isinstance(failure, Exception):
                        log.error("tool tasks: a poll failed", exc_info=failure)
            except Exception:
                log.exception("tool tasks: a look at the due tasks failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._started.wait(), self.timings.tick)
            self._started.clear()

    async def _poll(self, task: ToolTask) -> None:
        if task.state is TaskState.CANCELLED:
            # The host cancelled it while a call of the log's last step waited: its end is
            # appended now, without asking the server again.
            await self._end(task, None, "")
            return
        try:
            report = await self.runner.poll_task(
                task.tenant, task.server, task.tool, task.task_id, self.timings.request_timeout
            )
        except ToolCallFailed as error:
            # The server could not be asked (unreachable, a restart): polled again later.
            log.info("polling task %s of %s failed: %s", task.task_id, task.server, error)
            await self._reschedule(replace(task, polls=task.polls + 1))
            return
        polled = replace(
            task,
            state=report.state,
            status_message=report.status_message,
            polls=task.polls + 1,
            poll_interval_seconds=report.poll_interval_seconds,
        )
        if self.questions is not None and await self._asks(task, polled, report):
            return
        if report.state.ended:
            await self._end(polled, report.result, report.detail)
        else:
            await self._reschedule(polled)

    async def _asks(self, task: ToolTask, polled: ToolTask, report: TaskReport) -> bool:
        """A poll's questions stored as a round for the host, and an unanswered round that
        ran out ended; True when that ended the task."""
        assert self.questions is not None
        if report.state is TaskState.INPUT_REQUIRED and report.asked is not None:
            wait = await self.questions.asked(polled, report.asked)
            if wait is not None and datetime.now(UTC) >= wait.expire_time:
                await self._expired(polled, wait)
                return True
        elif task.state is TaskState.INPUT_REQUIRED:
            # The server went on (or ended the task) without the answer: the round is over.
            waiting = await self.questions.open_round(task)
            if waiting is not None:
                await self.questions.expire(waiting)
        return False

    async def _reschedule(self, task: ToolTask) -> None:
        next_poll = time.time() + self._next_wait(task)
        await self.blocking(self.repository.reschedule, task, next_poll)

    def _next_wait(self, task: ToolTask) -> float:
        """Backoff from the first poll, doubling per poll up to the longest; never sooner
        than the server asks."""
        timings = self.timings
        wait: float = min(timings.first_poll * float(2 ** min(task.polls, 30)), timings.max_poll)
        if task.poll_interval_seconds is not None:
            wait = max(wait, min(task.poll_interval_seconds, timings.max_poll))
        return wait

    async def _end(
        self, task: ToolTask, result: McpToolResult | None, detail: str
    ) -> ToolTask | None:
        """Append the task's outcome to the Run's log as a step of its own, then store the
        task ended. A log with a call still waiting for its result (the host is mid-step)
        gets it later: the task is polled again."""
        appended = await self.blocking(self._append_outcome, task, result, detail)
        if appended is None:
            # Polled again (a cancelled one is not asked again, see `_poll`).
            await self._reschedule(task)
            return None
        sequence, handle = appended
        ended = replace(
            task,
            result_call_id=result_call_id(task.call_id),
            result_sequence=sequence,
            result_handle=handle,
        )
        return await self.blocking(self.repository.end_task, ended)

    def _append_outcome(
        self, task: ToolTask, result: McpToolResult | None, detail: str
    ) -> tuple[int, str] | None:
        """On a storage thread: the step and its result appended (once, whichever sidecar
        asks: the request id is the call's), or None while a call of the log's last step
        waits for its result."""
        if _a_call_waits(self.log_reader, task.run_id):
            return None
        ended_call_id = result_call_id(task.call_id)
        if result is None:
            content: tuple[ContentPart, ...] = (ContentPart.text(_ended_text(task, detail)),)
            is_error = True
        else:
            content, is_error = result.content, result.is_error
        arguments = json.dumps({"call_id": task.call_id}, sort_keys=True)
        records = (
            Record(
                RecordKind.ASSISTANT_MESSAGE,
                tool_calls=(ToolCall(ended_call_id, TASK_RESULT_TOOL, arguments),),
            ),
            Record(
                RecordKind.TOOL_RESULT,
                content=content,
                call_id=ended_call_id,
                server=task.server,
                tool=task.tool,
                is_error=is_error,
            ),
        )
        try:
            appended = self.runs.append(task.run_id, ended_call_id, records)
        except SidecarError as error:
            if error.reason is Reason.RUN_NOT_FOUND:
                # The Run was deleted (its task row with it, or about to be).
                return (0, "")
            if error.reason is not Reason.REQUEST_ID_REUSED:
                raise
            # Another sidecar appended a different outcome first: it stands.
            return (0, "")
        return appended[1].sequence, appended[1].handle


def _a_call_waits(log_reader: LogReader, run_id: str) -> bool:
    """Whether a tool call of the log's last assistant step has no result yet."""
    waiting: set[str] = set()
    for skeleton in log_reader.record_skeletons(run_id):
        if skeleton.kind is RecordKind.ASSISTANT_MESSAGE:
            waiting = {call.call_id for call in skeleton.tool_calls}
        elif skeleton.kind is RecordKind.TOOL_RESULT:
            waiting.discard(skeleton.call_id)
    return bool(waiting)

"""A running task's own questions (the tasks extension's `input_required` status): they reach
the host as any call's do.

A poll that finds the task `input_required` stores its `inputRequests` as a round of the
task's call (`InputWaits`, the request id the task's outcome is appended under), once per set
of questions: GetToolTask shows the round (attempt, requests, expiry), the prompt's transient
zone says the call waits, and ContinueToolCall answers it; the answers go to the server with
`tasks/update` (a request left unanswered is cancelled) and the task runs on. A round nobody
answers in time ends the task: the server is asked to cancel it, and the task's outcome is a
tool error saying nobody answered, appended to the log as any task's end.

Logged at INFO: that a task asks, how many requests, and how each was answered; never what
the user entered.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from psych_sidecar.domain.calls.task_types import TaskState, ToolTask, result_call_id
from psych_sidecar.domain.catalog import (
    InputAnswer,
    InputAsked,
    InputWait,
    InputWaits,
    RoundOutcome,
    ToolCallFailed,
    new_attempt,
)
from psych_sidecar.domain.runlog import OffLoop

log = logging.getLogger(__name__)

Answer = Callable[[ToolTask, InputAsked, Sequence[InputAnswer]], Awaitable[None]]
"""Delivers answers to the task's server (`tasks/update`); raises ToolCallFailed."""


def is_task_round(wait: InputWait) -> bool:
    """Whether the round is a running task's questions (not a call's before it answered)."""
    return wait.request_id == result_call_id(wait.call_id)


def unanswered_text(wait: InputWait, wait_seconds: float) -> str:
    question = wait.asked.requests[0].message if wait.asked.requests else "its question"
    one_line = " ".join(question.split())
    shown = one_line if len(one_line) <= 80 else one_line[:79] + "…"
    return (
        f"it asked the user for input ({shown!r}) and nobody answered within "
        f"{wait_seconds:g} seconds, so it was cancelled"
    )


class TaskQuestions:
    def __init__(self, *, waits: InputWaits, wait_seconds: float, blocking: OffLoop) -> None:
        self._waits = waits
        self.wait_seconds = wait_seconds
        self._blocking = blocking

    async def open_round(self, task: ToolTask) -> InputWait | None:
        """The task's round still awaiting an answer (expired or not); None when none."""
        rounds = await self._blocking(
            self._waits.latest_round, task.run_id, result_call_id(task.call_id)
        )
        return None if rounds is None or rounds.ended else rounds.latest

    async def asked(self, task: ToolTask, asked: InputAsked) -> InputWait | None:
        """The open round for the questions a poll found: the one stored already, or a new
        one. None while the server has not yet taken the answers to the same requests."""
        request_id = result_call_id(task.call_id)
        rounds = await self._blocking(self._waits.latest_round, task.run_id, request_id)
        keys = {request.key for request in asked.requests}
        if rounds is not None and {r.key for r in rounds.latest.asked.requests} == keys:
            return None if rounds.ended else rounds.latest
        number = 1 if rounds is None else rounds.latest.round + 1
        now = datetime.now(UTC)
        wait = InputWait(
            run_id=task.run_id,
            request_id=request_id,
            round=number,
            call_id=task.call_id,
            server=task.server,
            tool=task.tool,
            attempt=new_attempt(number),
            arguments_json="{}",
            asked=asked,
            create_time=now,
            expire_time=now + timedelta(seconds=self.wait_seconds),
        )
        await self._blocking(self._waits.add_round, wait)
        log.info(
            "task %s of call %s (%s/%s) asks for input: %d requests, round %d",
            task.task_id,
            task.call_id,
            task.server,
            task.tool,
            len(asked.requests),
            number,
        )
        return wait

    async def expire(self, wait: InputWait) -> bool:
        """Mark an unanswered round expired: True when this call did (an answer did not win)."""
        return bool(await self._blocking(self._waits.end_round, wait, RoundOutcome.EXPIRED, ()))

    async def answer(
        self, task: ToolTask, wait: InputWait, answers: Sequence[InputAnswer], deliver: Answer
    ) -> ToolTask:
        """The round's answers (already stored, its outcome set) delivered to the server. The
        task runs on; when the server could not be reached, the same questions are asked
        again as a new round (the host answers again), nothing lost."""
        try:
            await deliver(task, wait.asked, answers)
        except ToolCallFailed as error:
            log.info("task %s: the answers could not be delivered: %s", task.task_id, error)
            again = replace(
                wait,
                round=wait.round + 1,
                attempt=new_attempt(wait.round + 1),
                create_time=datetime.now(UTC),
                expire_time=datetime.now(UTC) + timedelta(seconds=self.wait_seconds),
            )
            await self._blocking(self._waits.add_round, again)
            return replace(task, state=TaskState.INPUT_REQUIRED, waiting=again)
        return replace(task, state=TaskState.WORKING, waiting=None)

"""ContinueToolCall: a call waiting for its user's input, continued with the answers.

The host names the call and the round's attempt. The round is answered in one conditional
write (one answer wins, whichever sidecar gets it), then the call goes on through its server
(`McpCalls.continue_call`: repeated with the answers and the echoed request state on
2026-07-28, the held question answered on 2025-11-25) and ends like any call: its result
recorded in the Run's log, or another round of questions. A retry of an answer gets what the
answer led to; an attempt no call waits on is INPUT_NOT_AWAITED.

Logged: which call was answered and how (accept, decline, cancel), never what the user
entered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from psych_sidecar.domain.calls.ledger import CallLedger
from psych_sidecar.domain.calls.mcp_calls import McpCalls
from psych_sidecar.domain.calls.outcomes import CallOutcome, ToolOutcome, WaitingCall
from psych_sidecar.domain.calls.task_input import is_task_round
from psych_sidecar.domain.calls.task_types import ToolTask
from psych_sidecar.domain.calls.tasks import ToolTasks
from psych_sidecar.domain.catalog import (
    CallRounds,
    InputAnswer,
    InputWait,
    RoundOutcome,
    content_problem,
)
from psych_sidecar.domain.errors import (
    ConnectionUnreachable,
    field_invalid,
    field_required,
    input_not_awaited,
    quoted,
)
from psych_sidecar.domain.runlog import MAX_IDENTIFIER_LENGTH, OffLoop
from psych_sidecar.domain.surface import ResolvedTurn, RunContext, TurnResolver

log = logging.getLogger(__name__)

# The most answers one continuation takes (a server asks a few questions a round).
MAX_ANSWERS = 64


@dataclass(frozen=True, kw_only=True, slots=True)
class CallContinuation:
    resolver: TurnResolver
    ledger: CallLedger
    mcp: McpCalls
    blocking: OffLoop
    default_timeout_seconds: float
    # Where a running task's own questions are answered (None: none asks).
    tasks: ToolTasks | None = None

    async def continue_call(
        self,
        run_id: str,
        call_id: str,
        attempt: str,
        answers: tuple[InputAnswer, ...],
        timeout_seconds: float | None,
    ) -> CallOutcome | ToolTask:
        """The call's outcome, or its next round; for a running task's round, the task (it
        runs on with the answers)."""
        if not run_id:
            raise field_required("run_id")
        if not call_id:
            raise field_required("call_id")
        if not attempt:
            raise field_required("attempt")
        if len(attempt) > MAX_IDENTIFIER_LENGTH:
            raise field_invalid("attempt", f"at most {MAX_IDENTIFIER_LENGTH} characters")
        if len(answers) > MAX_ANSWERS:
            raise field_invalid("answers", f"at most {MAX_ANSWERS}")
        keys = [answer.key for answer in answers]
        if len(set(keys)) != len(keys):
            raise field_invalid("answers", "each request is answered once")
        for index, answer in enumerate(answers):
            if answer.content is not None and (problem := content_problem(answer.content)):
                raise field_invalid(f"answers[{index}].content", problem)
        timeout = timeout_seconds or self.default_timeout_seconds

        async def once() -> CallOutcome | ToolTask:
            return await self._continue(run_id, call_id, attempt, answers, timeout)

        # An answer sent twice at once (a retry after a lost response) is given once.
        return await self.ledger.single(("continue", run_id, call_id, attempt), once)

    async def _continue(
        self,
        run_id: str,
        call_id: str,
        attempt: str,
        answers: tuple[InputAnswer, ...],
        timeout_seconds: float,
    ) -> CallOutcome | ToolTask:
        resolved, rounds = await self.blocking(self._resolved_and_rounds, run_id, call_id)
        if rounds is None or attempt not in rounds.attempts:
            raise input_not_awaited(run_id, call_id, "the call never waited on that attempt")
        wait = rounds.latest
        if self.tasks is not None and is_task_round(wait):
            return await self._continue_task(self.tasks, rounds, attempt, answers, timeout_seconds)
        if attempt != wait.attempt or rounds.ended:
            # An answer given before (this is its retry): what it led to.
            recorded = await self.blocking(self.ledger.recorded_of, wait)
            if recorded is not None:
                return ToolOutcome.of(recorded)
            if not rounds.ended:
                return WaitingCall.of(wait)
            raise input_not_awaited(run_id, call_id, "that round is being answered")
        if datetime.now(UTC) >= wait.expire_time:
            return await self.ledger.waiting_or_expired(wait)
        # The answer is spent only on a session that reaches the server: one still connecting
        # (a sidecar that never ran it) is waited for, and one that cannot reach it leaves
        # the round open for the host to send the same answer again. (On 2025-11-25 a session
        # that connects anew no longer holds the question: the call ends saying it was lost.)
        why = await self.mcp.unreachable(resolved, wait, timeout_seconds)
        if why is not None:
            raise answer_not_delivered(wait, why)
        if datetime.now(UTC) >= wait.expire_time:
            return await self.ledger.waiting_or_expired(wait)
        await self._answered(wait, answers)
        result = await self.mcp.continue_call(resolved, wait, answers, timeout_seconds)
        return await self.ledger.settle(run_id, call_id, wait.request_id, result, wait.round + 1)

    async def _continue_task(
        self,
        tasks: ToolTasks,
        rounds: CallRounds,
        attempt: str,
        answers: tuple[InputAnswer, ...],
        timeout_seconds: float,
    ) -> ToolTask:
        """A running task's round: answered, the task runs on; a retry of an answer (or an
        older round's attempt) gets the task as it stands, its end in the log once it ended."""
        wait = rounds.latest
        if attempt != wait.attempt or rounds.ended:
            return await tasks.get(wait.run_id, wait.call_id)
        if datetime.now(UTC) >= wait.expire_time:
            return await tasks.expire_round(wait)
        await self._answered(wait, answers)
        return await tasks.answer(wait, answers, timeout_seconds)

    async def _answered(self, wait: InputWait, answers: tuple[InputAnswer, ...]) -> None:
        """The round's outcome set to answered, with the answers (one answer wins)."""
        waits = self.ledger.waits
        assert waits is not None  # a round was stored
        known = {request.key for request in wait.asked.requests}
        unknown = [key for key in (answer.key for answer in answers) if key not in known]
        if unknown:
            raise field_invalid("answers", f"no request with key {unknown[0][:64]!r}")
        if not await self.blocking(waits.end_round, wait, RoundOutcome.ANSWERED, answers):
            raise input_not_awaited(wait.run_id, wait.call_id, "that round was answered meanwhile")
        log.info(
            "tool call %s (%s/%s) round %d answered: %s",
            wait.call_id,
            wait.server,
            wait.tool,
            wait.round,
            ", ".join(f"{answer.key}={answer.action.value}" for answer in answers) or "none",
        )

    def _resolved_and_rounds(
        self, run_id: str, call_id: str
    ) -> tuple[ResolvedTurn, CallRounds | None]:
        context: RunContext
        context, resolved = self.resolver.resolved(run_id)
        del context
        waits = self.ledger.waits
        rounds = None if waits is None else waits.rounds_of_call(run_id, call_id)
        return resolved, rounds


def answer_not_delivered(wait: InputWait, why: str) -> ConnectionUnreachable:
    """CONNECTION_UNREACHABLE for an answer that was not given: the round still waits."""
    return ConnectionUnreachable(
        f"the answer to call {quoted(wait.call_id)} was not given (its round still waits; send the "
        f"same answer again): {why}",
        connection=wait.server,
        detail=why,
    )

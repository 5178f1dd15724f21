"""Calls waiting for their user's input, as stored: one :class:`InputWait` per round of a
server's questions (storage implements :class:`InputWaits`).

A round waits until it is answered (ContinueToolCall) or expires. Answering sets its outcome
in one conditional write, so one answer wins whichever sidecar gets it; the call then ends
(its result recorded in the Run's log) or asks again (the next round).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from psych_sidecar.domain.catalog.input_requests import InputAnswer, InputAsked, InputRequest


class RoundOutcome(StrEnum):
    ANSWERED = "answered"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class InputWait:
    """One round: the call (`request_id` names it in its assistant step), what the server
    asked, and until when the answer is awaited. `attempt` is what the host echoes."""

    run_id: str
    request_id: str
    round: int
    call_id: str
    server: str
    tool: str
    attempt: str
    arguments_json: str
    asked: InputAsked
    create_time: datetime
    expire_time: datetime

    def requests_json(self) -> str:
        return json.dumps([request.as_json() for request in self.asked.requests])

    @staticmethod
    def requests_of(requests_json: str) -> tuple[InputRequest, ...]:
        return tuple(InputRequest.from_json(value) for value in json.loads(requests_json))


@dataclass(frozen=True, slots=True)
class CallRounds:
    """A call's rounds as they stand: the newest, whether it ended (answered or expired),
    and every round's attempt, oldest first."""

    latest: InputWait
    ended: bool
    attempts: tuple[str, ...]


def new_attempt(round_number: int) -> str:
    """An attempt no one can guess: the round, and 96 random bits."""
    return f"{round_number}.{secrets.token_urlsafe(12)}"


def answers_json(answers: Sequence[InputAnswer]) -> str:
    return json.dumps([answer.as_json() for answer in answers], ensure_ascii=False)


class InputWaits(Protocol):
    """Storage of the rounds. Synchronous: runs on the storage threads."""

    def latest_round(self, run_id: str, request_id: str) -> CallRounds | None:
        """The call's newest round and whether it ended (its `attempts` left empty); None
        when the call never asked."""
        ...

    def rounds_of_call(self, run_id: str, call_id: str) -> CallRounds | None:
        """The rounds of the Run's newest call with this call id; None when it never asked."""
        ...

    def add_round(self, wait: InputWait) -> None:
        """Store a new round (the call's first, or the one after an answered round)."""
        ...

    def end_round(
        self, wait: InputWait, outcome: RoundOutcome, answers: Sequence[InputAnswer]
    ) -> bool:
        """Set the round's outcome (and its answers) unless it has one: True when this
        call set it, False when another had (a concurrent answer won)."""
        ...

    def waiting_in_run(self, run_id: str, now: datetime) -> list[InputWait]:
        """The Run's rounds still awaiting an answer at `now`, oldest first."""
        ...

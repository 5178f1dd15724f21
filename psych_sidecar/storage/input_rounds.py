"""Rounds of a server's questions in the middle of a tool call (the `tool_input_rounds` table)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Row, insert, select, update

from psych_sidecar.domain.catalog import (
    CallRounds,
    InputAnswer,
    InputAsked,
    InputWait,
    RoundOutcome,
    answers_json,
)
from psych_sidecar.storage import tables
from psych_sidecar.storage.transactions import read_transaction, write_transaction

# The columns that hold the InputWait field of the same name, as it is.
_AS_STORED = (
    "run_id",
    "request_id",
    "round",
    "call_id",
    "server",
    "tool",
    "attempt",
    "arguments_json",
)


class SqlInputRounds:
    """Implements the domain's InputWaits over SQLAlchemy Core."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def latest_round(self, run_id: str, request_id: str) -> CallRounds | None:
        rounds = tables.tool_input_rounds
        with read_transaction(self._engine) as conn:
            row = conn.execute(
                select(rounds)
                .where(rounds.c.run_id == run_id, rounds.c.request_id == request_id)
                .order_by(rounds.c.round.desc())
                .limit(1)
            ).first()
        if row is None:
            return None
        return CallRounds(latest=_wait(row), ended=row.outcome is not None, attempts=())

    def rounds_of_call(self, run_id: str, call_id: str) -> CallRounds | None:
        rounds = tables.tool_input_rounds
        with read_transaction(self._engine) as conn:
            rows = conn.execute(
                select(rounds)
                .where(rounds.c.run_id == run_id, rounds.c.call_id == call_id)
                .order_by(rounds.c.create_time_us, rounds.c.round)
            ).all()
        if not rows:
            return None
        # The newest call with this id (a call id used again in a later step starts anew).
        request_id = rows[-1].request_id
        mine = [row for row in rows if row.request_id == request_id]
        return CallRounds(
            latest=_wait(mine[-1]),
            ended=mine[-1].outcome is not None,
            attempts=tuple(row.attempt for row in mine),
        )

    def add_round(self, wait: InputWait) -> None:
        with write_transaction(self._engine) as conn:
            conn.execute(
                insert(tables.tool_input_rounds).values(
                    **tables.same_named(wait, _AS_STORED),
                    protocol_version=wait.asked.protocol_version,
                    requests_json=wait.requests_json(),
                    request_state=wait.asked.request_state,
                    held=wait.asked.held,
                    create_time_us=tables.to_us(wait.create_time),
                    expire_time_us=tables.to_us(wait.expire_time),
                )
            )

    def end_round(
        self, wait: InputWait, outcome: RoundOutcome, answers: Sequence[InputAnswer]
    ) -> bool:
        rounds = tables.tool_input_rounds
        with write_transaction(self._engine) as conn:
            ended = conn.execute(
                update(rounds)
                .where(
                    rounds.c.run_id == wait.run_id,
                    rounds.c.request_id == wait.request_id,
                    rounds.c.round == wait.round,
                    rounds.c.outcome.is_(None),
                )
                .values(outcome=outcome.value, answers_json=answers_json(answers))
            )
            return ended.rowcount == 1

    def waiting_in_run(self, run_id: str, now: datetime) -> list[InputWait]:
        rounds = tables.tool_input_rounds
        with read_transaction(self._engine) as conn:
            rows = conn.execute(
                select(rounds)
                .where(
                    rounds.c.run_id == run_id,
                    rounds.c.outcome.is_(None),
                    rounds.c.expire_time_us > tables.to_us(now),
                )
                .order_by(rounds.c.create_time_us, rounds.c.request_id)
            ).all()
        return [_wait(row) for row in rows]


def _wait(row: Row[Any]) -> InputWait:
    return InputWait(
        **tables.same_named(row, _AS_STORED),
        asked=InputAsked(
            InputWait.requests_of(row.requests_json),
            row.protocol_version,
            request_state=row.request_state,
            held=row.held,
        ),
        create_time=tables.from_us(row.create_time_us),
        expire_time=tables.from_us(row.expire_time_us),
    )

"""SqlToolTasks: calls that run as tasks on their MCP server, in SQL.

A due task is claimed by moving its next poll forward in one short write transaction, only
if no other sidecar moved it first (the update's WHERE names the poll time it read): with
many sidecars on one database each due task is polled by one of them, and no lock is held
while its server answers. A task claimed by a sidecar that then dies is due again when the
claim's lease has run out.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import ColumnElement, Engine, Row, and_, insert, select, update

from psych_sidecar.domain.calls import TaskState, ToolTask
from psych_sidecar.storage import tables
from psych_sidecar.storage.tables import from_us, same_named, to_us
from psych_sidecar.storage.transactions import read_transaction, write_transaction


def _us(seconds: float) -> int:
    return int(seconds * 1_000_000)


# The columns that hold the ToolTask field of the same name, as it is.
_AS_STORED = ("run_id", "call_id", "tenant", "server", "tool", "task_id", "status_message", "polls")


def _task_row(run_id: str, call_id: str) -> tuple[ColumnElement[bool], ...]:
    table = tables.tool_tasks
    return (table.c.run_id == run_id, table.c.call_id == call_id)


def _task(row: Row[Any]) -> ToolTask:
    interval = row.poll_interval_ms
    return ToolTask(
        **same_named(row, _AS_STORED),
        state=TaskState(row.state),
        create_time=from_us(row.create_time_us),
        update_time=from_us(row.update_time_us),
        poll_interval_seconds=None if interval is None else interval / 1000,
        result_call_id=row.result_call_id or "",
        result_sequence=row.result_sequence or 0,
        result_handle=row.result_handle or "",
    )


class SqlToolTasks:
    """Implements TaskRepository. Every method is one transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def insert_task(self, task: ToolTask, next_poll: float) -> None:
        table = tables.tool_tasks
        with write_transaction(self._engine) as conn:
            found = conn.execute(
                select(table.c.run_id).where(*_task_row(task.run_id, task.call_id))
            ).first()
            if found is not None:
                return
            conn.execute(
                insert(table).values(
                    **same_named(task, _AS_STORED),
                    state=task.state.value,
                    create_time_us=to_us(task.create_time),
                    update_time_us=to_us(task.update_time),
                    next_poll_us=_us(next_poll),
                    poll_interval_ms=_interval_ms(task),
                )
            )

    def get_task(self, run_id: str, call_id: str) -> ToolTask | None:
        table = tables.tool_tasks
        with read_transaction(self._engine) as conn:
            row = conn.execute(select(table).where(*_task_row(run_id, call_id))).first()
        return None if row is None else _task(row)

    def claim_due(self, lease_seconds: float, limit: int) -> list[ToolTask]:
        table = tables.tool_tasks
        now = time.time()
        with read_transaction(self._engine) as conn:
            rows = conn.execute(
                select(table)
                .where(table.c.result_call_id.is_(None), table.c.next_poll_us <= _us(now))
                .order_by(table.c.next_poll_us)
                .limit(limit)
            ).all()
        claimed: list[ToolTask] = []
        for row in rows:
            with write_transaction(self._engine) as conn:
                moved = conn.execute(
                    update(table)
                    .where(
                        and_(
                            *_task_row(row.run_id, row.call_id),
                            table.c.next_poll_us == row.next_poll_us,
                            table.c.result_call_id.is_(None),
                        )
                    )
                    .values(next_poll_us=_us(now + lease_seconds))
                )
            if moved.rowcount == 1:
                claimed.append(_task(row))
        return claimed

    def reschedule(self, task: ToolTask, next_poll: float) -> None:
        table = tables.tool_tasks
        with write_transaction(self._engine) as conn:
            conn.execute(
                update(table)
                .where(*_still_open(task))
                .values(
                    **_progress(task),
                    next_poll_us=_us(next_poll),
                    poll_interval_ms=_interval_ms(task),
                )
            )

    def end_task(self, task: ToolTask) -> ToolTask | None:
        table = tables.tool_tasks
        with write_transaction(self._engine) as conn:
            ended = conn.execute(
                update(table)
                .where(*_still_open(task))
                .values(
                    **_progress(task),
                    result_call_id=task.result_call_id,
                    result_sequence=task.result_sequence,
                    result_handle=task.result_handle,
                )
            )
            if ended.rowcount != 1:
                return None
            row = conn.execute(select(table).where(*_task_row(task.run_id, task.call_id))).one()
        return _task(row)


def _still_open(task: ToolTask) -> tuple[ColumnElement[bool], ...]:
    """The task's row while it has no result: a poll that ended it elsewhere moves nothing."""
    table = tables.tool_tasks
    return (
        *_task_row(task.run_id, task.call_id),
        table.c.result_call_id.is_(None),
    )


def _progress(task: ToolTask) -> dict[str, Any]:
    """What every poll writes of where the task is, whether it ended or not."""
    return {
        "state": task.state.value,
        "status_message": task.status_message,
        "update_time_us": _us(time.time()),
        "polls": task.polls,
    }


def _interval_ms(task: ToolTask) -> int | None:
    seconds = task.poll_interval_seconds
    return None if seconds is None else int(seconds * 1000)

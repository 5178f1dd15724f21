"""Retried tool calls are answered from the log: append_requests keeps a call's result JSON
less the parts its result record holds (call_result_outline) and where they go back
(call_result_splices), not a second whole copy. Rows recorded before are converted, one at a
time; a result the log does not spell stays whole in its outline.

Revision ID: call_results_from_the_log
Revises: sealed_connection_secrets
Create Date: 2026-12-02
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from psych_sidecar.domain.runlog import CallResultOutline, ContentPart, PartKind

revision: str = "call_results_from_the_log"
down_revision: str | None = "sealed_connection_secrets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_requests = sa.table(
    "append_requests",
    sa.column("run_id", sa.String),
    sa.column("request_id", sa.String),
    sa.column("result", sa.Text),
    sa.column("call_result_json", sa.LargeBinary),
    sa.column("call_result_outline", sa.LargeBinary),
    sa.column("call_result_splices", sa.Text),
)
_parts = sa.table(
    "record_parts",
    sa.column("run_id", sa.String),
    sa.column("sequence", sa.BigInteger),
    sa.column("part_index", sa.Integer),
    sa.column("kind", sa.String),
    sa.column("mime_type", sa.Text),
    sa.column("data", sa.LargeBinary),
)


def _content(conn: sa.Connection, run_id: str, result: str) -> list[ContentPart]:
    """The parts of the one record a request appended (`result`: [[sequence, handle]])."""
    ((sequence, _handle),) = json.loads(result)
    rows = conn.execute(
        sa.select(_parts.c.kind, _parts.c.mime_type, _parts.c.data)
        .where(_parts.c.run_id == run_id, _parts.c.sequence == sequence)
        .order_by(_parts.c.part_index)
    )
    return [ContentPart(PartKind(kind), bytes(data), mime) for kind, mime, data in rows]


def _recorded_calls(conn: sa.Connection, column: str) -> list[tuple[str, str, str]]:
    """The keys of the rows that answer a retried call, and their [[sequence, handle]]."""
    query = sa.select(_requests.c.run_id, _requests.c.request_id, _requests.c.result).where(
        _requests.c[column].is_not(None)
    )
    return [(row.run_id, row.request_id, row.result) for row in conn.execute(query)]


def _one(run_id: str, request_id: str) -> sa.ColumnElement[bool]:
    return sa.and_(_requests.c.run_id == run_id, _requests.c.request_id == request_id)


def upgrade() -> None:
    with op.batch_alter_table("append_requests") as batch:
        batch.add_column(sa.Column("call_result_outline", sa.LargeBinary, nullable=True))
        batch.add_column(sa.Column("call_result_splices", sa.Text, nullable=True))
    conn = op.get_bind()
    for run_id, request_id, result in _recorded_calls(conn, "call_result_json"):
        whole = conn.execute(
            sa.select(_requests.c.call_result_json).where(_one(run_id, request_id))
        ).scalar_one()
        outline = CallResultOutline.of(bytes(whole), _content(conn, run_id, result))
        conn.execute(
            sa.update(_requests)
            .where(_one(run_id, request_id))
            .values(
                call_result_outline=outline.outline,
                call_result_splices=outline.splices_json(),
            )
        )
    with op.batch_alter_table("append_requests") as batch:
        batch.drop_column("call_result_json")


def downgrade() -> None:
    with op.batch_alter_table("append_requests") as batch:
        batch.add_column(sa.Column("call_result_json", sa.LargeBinary, nullable=True))
    conn = op.get_bind()
    for run_id, request_id, result in _recorded_calls(conn, "call_result_outline"):
        row = conn.execute(
            sa.select(_requests.c.call_result_outline, _requests.c.call_result_splices).where(
                _one(run_id, request_id)
            )
        ).one()
        outline = CallResultOutline.stored(bytes(row[0]), row[1])
        whole = outline.result_json(_content(conn, run_id, result))
        conn.execute(
            sa.update(_requests).where(_one(run_id, request_id)).values(call_result_json=whole)
        )
    with op.batch_alter_table("append_requests") as batch:
        batch.drop_column("call_result_splices")
        batch.drop_column("call_result_outline")

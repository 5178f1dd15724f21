"""Tool calls that run as tasks on their MCP server (the MCP tasks extension).

Revision ID: tool_tasks
Revises: journal_compactions
Create Date: 2026-12-04

One row per call that started as a task, keyed like its tool result (Run, call id): the
server's task id, where the task is, when it is next due a poll (a sidecar claims a due task
by moving this forward), and, once it ended, where its result is in the Run's log. Deleted
with its Run.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "tool_tasks"
down_revision: str | None = "journal_compactions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tool_tasks",
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("call_id", sa.Text, primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("server", sa.String(64), nullable=False),
        sa.Column("tool", sa.Text, nullable=False),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("status_message", sa.Text, nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
        sa.Column("update_time_us", sa.BigInteger, nullable=False),
        sa.Column("next_poll_us", sa.BigInteger, nullable=False),
        sa.Column("polls", sa.Integer, nullable=False),
        sa.Column("poll_interval_ms", sa.BigInteger, nullable=True),
        sa.Column("result_call_id", sa.Text, nullable=True),
        sa.Column("result_sequence", sa.BigInteger, nullable=True),
        sa.Column("result_handle", sa.Text, nullable=True),
    )
    op.create_index("ix_tool_tasks_due", "tool_tasks", ["next_poll_us"])


def downgrade() -> None:
    op.drop_index("ix_tool_tasks_due", table_name="tool_tasks")
    op.drop_table("tool_tasks")

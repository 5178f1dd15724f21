"""Tool calls waiting for their user's input: one row per round of a server's questions.

Revision ID: tool_input_rounds
Revises: tool_tasks
Create Date: 2026-12-04

A server may ask for input (an elicitation) before it answers a tools/call. The call waits
for the host's answer (ContinueToolCall); each round of questions, its answers and how it
ended are kept here, so a retry of the call gets the same questions, any sidecar on the
database can repeat a 2026-07-28 call with the answers, and AssemblePrompt can tell the model
which call waits.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "tool_input_rounds"
down_revision: str | None = "tool_tasks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tool_input_rounds",
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("request_id", sa.String(128), primary_key=True),
        sa.Column("round", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("call_id", sa.Text, nullable=False),
        sa.Column("server", sa.Text, nullable=False),
        sa.Column("tool", sa.Text, nullable=False),
        sa.Column("attempt", sa.String(64), nullable=False),
        sa.Column("protocol_version", sa.String(16), nullable=False),
        sa.Column("arguments_json", sa.Text, nullable=False),
        sa.Column("requests_json", sa.Text, nullable=False),
        sa.Column("request_state", sa.Text, nullable=True),
        sa.Column("held", sa.String(64), nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
        sa.Column("expire_time_us", sa.BigInteger, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("answers_json", sa.Text, nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
    )


def downgrade() -> None:
    op.drop_table("tool_input_rounds")

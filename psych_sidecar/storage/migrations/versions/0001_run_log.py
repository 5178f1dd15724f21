"""Specs, Runs and the append-only Record log.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "specs",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("spec_name", sa.String(128), nullable=False),
        sa.Column("spec_version", sa.BigInteger, nullable=False),
        sa.Column("tool_restrictions", sa.Text, nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
        sa.Column("last_sequence", sa.BigInteger, nullable=False, server_default="0"),
        sa.ForeignKeyConstraint(["spec_name", "spec_version"], ["specs.name", "specs.version"]),
    )
    op.create_index("ix_runs_tenant", "runs", ["tenant"])
    op.create_table(
        "records",
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("sequence", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
        sa.Column("handle", sa.String(40), nullable=True, unique=True),
        sa.Column("call_id", sa.Text, nullable=False),
        sa.Column("server", sa.Text, nullable=False),
        sa.Column("tool", sa.Text, nullable=False),
        sa.Column("is_error", sa.Boolean, nullable=False),
        sa.Column("tool_calls", sa.Text, nullable=False),
        sa.Column("content_bytes", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
    )
    op.create_table(
        "record_parts",
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("sequence", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("part_index", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("mime_type", sa.Text, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.ForeignKeyConstraint(["run_id", "sequence"], ["records.run_id", "records.sequence"]),
    )
    op.create_table(
        "append_requests",
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("request_id", sa.String(128), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("result", sa.Text, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
    )


def downgrade() -> None:
    for table in ("append_requests", "record_parts", "records", "runs", "specs"):
        op.drop_table(table)

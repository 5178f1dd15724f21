"""The assembly journal: one row of metadata per AssemblePrompt.

Revision ID: 0004_issue15 (kept: databases migrated before the files were renamed store it in
alembic_version)
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_issue15"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    zone_columns: list[sa.Column[int] | sa.Column[str]] = []
    for zone in ("static", "tail", "history", "transient"):
        zone_columns += [
            sa.Column(f"{zone}_bytes", sa.BigInteger, nullable=False),
            sa.Column(f"{zone}_tokens", sa.BigInteger, nullable=False),
            sa.Column(f"{zone}_sha256", sa.String(64), nullable=False),
        ]
    op.create_table(
        "assembly_journal",
        sa.Column("entry_id", sa.String(40), primary_key=True),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("spec_name", sa.String(128), nullable=False),
        sa.Column("spec_version", sa.BigInteger, nullable=False),
        sa.Column("turn", sa.BigInteger, nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("last_sequence", sa.BigInteger, nullable=False),
        *zone_columns,
        sa.Column("tool_count", sa.Integer, nullable=False),
        sa.Column("servers", sa.Text, nullable=False),
        sa.Column("elided", sa.Text, nullable=False),
        sa.Column("context_guard", sa.Text, nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
    )
    op.create_index("ix_assembly_journal_run", "assembly_journal", ["run_id", "create_time_us"])
    op.create_index("ix_assembly_journal_time", "assembly_journal", ["create_time_us"])


def downgrade() -> None:
    op.drop_index("ix_assembly_journal_time", table_name="assembly_journal")
    op.drop_index("ix_assembly_journal_run", table_name="assembly_journal")
    op.drop_table("assembly_journal")

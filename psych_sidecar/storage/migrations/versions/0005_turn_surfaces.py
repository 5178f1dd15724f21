"""The tool surface each turn of a Run is pinned with, shared by every sidecar.

Revision ID: 0005_issue13 (kept: databases migrated before the files were renamed store it in
alembic_version)
Revises: 0004_issue15
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_issue13"
down_revision: str | None = "0004_issue15"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "turn_surfaces",
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("turn_start", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("surface", sa.Text, nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
    )


def downgrade() -> None:
    op.drop_table("turn_surfaces")

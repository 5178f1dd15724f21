"""Stored sentence vectors for tool search.

Revision ID: 0006_issue16 (kept: databases migrated before the files were renamed store it in
alembic_version)
Revises: 0005_issue13
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_issue16"
down_revision: str | None = "0005_issue13"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "search_vectors",
        sa.Column("encoder", sa.String(128), primary_key=True),
        sa.Column("text_hash", sa.String(32), primary_key=True),
        sa.Column("vector", sa.LargeBinary, nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("search_vectors")

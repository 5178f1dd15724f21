"""How far the latest compaction reached, per assembly-journal row.

Revision ID: journal_compactions
Revises: oauth_refresh_claims
Create Date: 2026-12-04

The Run inspector's cache-miss explainer names a compaction as the cause of the miss it
makes: it compares this column of two calls. NULL for every existing row: no compaction.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "journal_compactions"
down_revision: str | None = "oauth_refresh_claims"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("assembly_journal") as batch:
        batch.add_column(sa.Column("compacted_through", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("assembly_journal") as batch:
        batch.drop_column("compacted_through")

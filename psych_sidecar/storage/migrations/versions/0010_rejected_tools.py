"""A catalogue version keeps the listed tools it left out (invalid definitions).

Revision ID: rejected_tools
Revises: call_results_from_the_log
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "rejected_tools"
down_revision: str | None = "call_results_from_the_log"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("catalog_versions") as batch:
        batch.add_column(
            sa.Column("rejected_tool_count", sa.Integer, nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("rejected_tools", sa.Text, nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("catalog_versions") as batch:
        batch.drop_column("rejected_tools")
        batch.drop_column("rejected_tool_count")

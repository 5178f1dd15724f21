"""Tool calls answer their retries: append_requests keeps a tool call's MCP result JSON.

Revision ID: 0012 (kept: databases migrated before the files were renamed store it in
alembic_version)
Revises: 0006_issue16
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0006_issue16"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("append_requests") as batch:
        batch.add_column(sa.Column("call_result_json", sa.LargeBinary, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("append_requests") as batch:
        batch.drop_column("call_result_json")

"""Provider-reported usage per model call; character counts of text content parts.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_events",
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("event_id", sa.String(128), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("input_tokens", sa.BigInteger, nullable=False),
        sa.Column("output_tokens", sa.BigInteger, nullable=False),
        sa.Column("cache_read_tokens", sa.BigInteger, nullable=False),
        sa.Column("cache_write_tokens", sa.BigInteger, nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
    )
    with op.batch_alter_table("record_parts") as batch:
        batch.add_column(sa.Column("char_count", sa.BigInteger, nullable=True))
    # Text and JSON parts are UTF-8; count their characters once, here, so that readers can
    # plan previews and slices without loading the content.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "UPDATE record_parts SET char_count = length(convert_from(data, 'UTF8')) "
            "WHERE kind IN ('text', 'json')"
        )
    else:
        op.execute(
            "UPDATE record_parts SET char_count = length(CAST(data AS TEXT)) "
            "WHERE kind IN ('text', 'json')"
        )


def downgrade() -> None:
    with op.batch_alter_table("record_parts") as batch:
        batch.drop_column("char_count")
    op.drop_table("usage_events")

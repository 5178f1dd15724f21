"""MCP connections and their versioned, soft-delete catalogue.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "connections",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("transport", sa.String(16), nullable=False),
        sa.Column("command", sa.Text, nullable=False),
        sa.Column("args", sa.Text, nullable=False),
        sa.Column("env", sa.Text, nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("headers", sa.Text, nullable=False),
        sa.Column("preload", sa.Boolean, nullable=True),
        sa.Column("eager_tools", sa.Text, nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("allow_tools", sa.Text, nullable=False),
        sa.Column("deny_tools", sa.Text, nullable=False),
        sa.Column("catalog_version", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
        sa.Column("update_time_us", sa.BigInteger, nullable=False),
        sa.Column("delete_time_us", sa.BigInteger, nullable=True),
    )
    op.create_table(
        "catalog_versions",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("server", sa.String(64), primary_key=True),
        sa.Column("catalog_version", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("tool_count", sa.Integer, nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(["tenant", "server"], ["connections.tenant", "connections.name"]),
    )
    op.create_table(
        "catalog_tools",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("server", sa.String(64), primary_key=True),
        sa.Column("catalog_version", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("input_schema", sa.LargeBinary, nullable=False),
        sa.Column("output_schema", sa.LargeBinary, nullable=False),
        sa.Column("annotations", sa.LargeBinary, nullable=False),
        sa.Column("removed_in_version", sa.BigInteger, nullable=False, server_default="0"),
        sa.ForeignKeyConstraint(
            ["tenant", "server", "catalog_version"],
            [
                "catalog_versions.tenant",
                "catalog_versions.server",
                "catalog_versions.catalog_version",
            ],
        ),
    )
    op.create_index(
        "ix_catalog_tools_current",
        "catalog_tools",
        ["tenant", "server", "removed_in_version"],
    )


def downgrade() -> None:
    op.drop_index("ix_catalog_tools_current", table_name="catalog_tools")
    op.drop_table("catalog_tools")
    op.drop_table("catalog_versions")
    op.drop_table("connections")

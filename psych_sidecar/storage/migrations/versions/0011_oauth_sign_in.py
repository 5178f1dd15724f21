"""OAuth: a connection's auth settings, its grants (tokens, client), and begun sign-ins.

Revision ID: oauth_sign_in
Revises: rejected_tools
Create Date: 2026-12-02

Adds nothing secret in plaintext: the new secret columns hold envelopes only (NULL or empty
tables at upgrade), so no key is needed here.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "oauth_sign_in"
down_revision: str | None = "rejected_tools"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("connections") as batch:
        batch.add_column(sa.Column("auth", sa.Text, nullable=False, server_default=""))
        batch.add_column(sa.Column("auth_secrets", sa.Text, nullable=True))
    op.create_table(
        "oauth_grants",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("tokens", sa.Text, nullable=False),
        sa.Column("client", sa.Text, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("expire_time_us", sa.BigInteger, nullable=True),
        sa.Column("authorization_reason", sa.String(32), nullable=True),
        sa.Column("update_time_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "oauth_sign_ins",
        sa.Column("state_digest", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("secrets", sa.Text, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("resource", sa.Text, nullable=False),
        sa.Column("create_time_us", sa.BigInteger, nullable=False),
        sa.Column("expire_time_us", sa.BigInteger, nullable=False),
        sa.Column("used_time_us", sa.BigInteger, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("oauth_sign_ins")
    op.drop_table("oauth_grants")
    with op.batch_alter_table("connections") as batch:
        batch.drop_column("auth_secrets")
        batch.drop_column("auth")

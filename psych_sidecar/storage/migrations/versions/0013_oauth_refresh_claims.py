"""A refresh claim on an OAuth grant: who is refreshing it, and until when.

Revision ID: oauth_refresh_claims
Revises: records_by_kind
Create Date: 2026-12-03

A refresh held the grant's row lock (a storage thread and a database connection, SQLite's
write lock) while the token endpoint answered; it now claims the grant in one short
transaction, asks with no transaction open, and stores the result in another while the
claim is still its own. Both columns are NULL for every existing row: no claim.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "oauth_refresh_claims"
down_revision: str | None = "records_by_kind"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("oauth_grants") as batch:
        batch.add_column(sa.Column("refresh_claimant", sa.String(64), nullable=True))
        batch.add_column(sa.Column("refresh_claim_until_us", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("oauth_grants") as batch:
        batch.drop_column("refresh_claim_until_us")
        batch.drop_column("refresh_claimant")

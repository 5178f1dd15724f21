"""An index on a Run's records by kind: the turn's start (the last user message) and the
latest assistant step are found in a few page reads, not by reading every record of the Run.

Revision ID: records_by_kind
Revises: oauth_sign_in
Create Date: 2026-12-02

Every ResolveTurn, AssemblePrompt and tool call asks one of those two; without the index
each asked the Run's whole log (one row look-up per record), so a call grew slower with
every record the Run had.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "records_by_kind"
down_revision: str | None = "oauth_sign_in"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_records_run_kind", "records", ["run_id", "kind", "sequence"])


def downgrade() -> None:
    op.drop_index("ix_records_run_kind", table_name="records")

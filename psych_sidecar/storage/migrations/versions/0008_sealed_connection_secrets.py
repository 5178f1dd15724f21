"""Connection secrets sealed: env and headers become AES-256-GCM envelopes.

Each live connection's env and headers are sealed under the primary key, and nothing of the
plaintext is left in the SQLite file.

Revision ID: sealed_connection_secrets
Revises: 0012 (0007_tool_call_results)
Create Date: 2026-12-02

Needs the key ring (handed in by psych_sidecar.storage.migrate.migrate) only when there is plaintext
to seal; the downgrade opens the envelopes again, so it needs the keys that sealed them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from psych_sidecar.secrets.cipher import KeyRing, is_sealed
from psych_sidecar.secrets.cipher import context as secret_context

revision: str = "sealed_connection_secrets"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FIELDS = ("env", "headers")
_connections = sa.table(
    "connections",
    sa.column("tenant", sa.String),
    sa.column("name", sa.String),
    sa.column("env", sa.Text),
    sa.column("headers", sa.Text),
    sa.column("delete_time_us", sa.BigInteger),
)


def _keys() -> KeyRing:
    keys = context.config.attributes.get("secret_keys")
    if not isinstance(keys, KeyRing):
        raise RuntimeError(
            "stored connection secrets must be sealed by this migration, which needs the "
            "secret keys (secret_keys or secret_key_file)"
        )
    return keys


def _rewrite(seal: bool) -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        # What the rewrite replaces is zeroed in the file, not left in its free space (the
        # migration's caller then empties the write-ahead log).
        bind.exec_driver_sql("PRAGMA secure_delete=ON")
    table = _connections
    rows = bind.execute(sa.select(table)).all()
    keys: KeyRing | None = None
    for row in rows:
        values: dict[str, str] = {}
        for field in _FIELDS:
            stored = getattr(row, field)
            if row.delete_time_us is not None:
                # A deleted connection keeps no secret (it should hold "{}" already).
                if stored != "{}":
                    values[field] = "{}"
                continue
            if is_sealed(stored) == seal:
                continue
            keys = keys or _keys()
            where = secret_context("connections", row.tenant, row.name, field)
            values[field] = keys.seal(stored, where) if seal else keys.open(stored, where)
        if values:
            bind.execute(
                sa.update(table)
                .where(table.c.tenant == row.tenant, table.c.name == row.name)
                .values(**values)
            )


def upgrade() -> None:
    _rewrite(seal=True)


def downgrade() -> None:
    _rewrite(seal=False)

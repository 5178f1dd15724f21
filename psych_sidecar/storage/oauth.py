"""SqlOAuthStore: OAuth grants (tokens, client) and begun sign-ins in SQL, sealed.

Tokens, the registered client and a sign-in's PKCE verifier are envelopes (psych_sidecar.secrets)
bound to their row and field; they are sealed and opened here. A refresh is two short write
transactions with the grant's row locked (SELECT ... FOR UPDATE on PostgreSQL, SQLite's single
writer) and the token request between them, outside any: the first reads the row again and
claims the refresh (`refresh_claimant`, `refresh_claim_until_us`), the second stores the
result only while the claim is still the claimant's. With many sidecars on one database, one
refreshes and the others find its claim, wait, then read its result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, Engine, Row, Table, delete, insert, select, update
from sqlalchemy import Connection as SqlConnection

from psych_sidecar.domain.catalog import (
    AuthorizationReason,
    OAuthGrant,
    PendingSignIn,
    RefreshClaim,
)
from psych_sidecar.secrets.cipher import KeyRing, SecretUnreadable, context
from psych_sidecar.storage import tables
from psych_sidecar.storage.engines import erase_freed_content, settle_freed_content
from psych_sidecar.storage.transactions import read_transaction, write_transaction

# Spent or expired sign-ins are kept this long (so a late CompleteSignIn is told "used" or
# "expired" rather than "unknown"), then removed when the next sign-in begins.
_SIGN_IN_KEPT = timedelta(days=1)

# The oauth_sign_ins columns that hold the PendingSignIn field of the same name, as it is.
_SIGN_IN_AS_STORED = ("state_digest", "tenant", "name", "revision", "scope", "resource")

# A grant's refresh-claim columns once its claim is over.
_NO_CLAIM = {"refresh_claimant": None, "refresh_claim_until_us": None}


def _grant_context(tenant: str, name: str, field: str) -> bytes:
    return context("oauth_grants", tenant, name, field)


def _sign_in_context(state_digest: str) -> bytes:
    return context("oauth_sign_ins", state_digest, "secrets")


def grant_row(tenant: str, name: str) -> tuple[ColumnElement[bool], ...]:
    """The connection's grant: its row in oauth_grants."""
    table = tables.oauth_grants
    return (table.c.tenant == tenant, table.c.name == name)


class SqlOAuthStore:
    """Implements OAuthRepository. Every method is one transaction."""

    def __init__(self, engine: Engine, keys: KeyRing) -> None:
        self._engine = engine
        self._keys = keys

    # Sign-ins

    def save_sign_in(self, pending: PendingSignIn) -> None:
        table = tables.oauth_sign_ins
        secrets = json.dumps({"verifier": pending.verifier, "client": pending.client_json})
        now = tables.now_us()
        with write_transaction(self._engine) as conn:
            conn.execute(
                delete(table).where(
                    table.c.expire_time_us < now - int(_SIGN_IN_KEPT.total_seconds() * 1e6)
                )
            )
            conn.execute(
                insert(table).values(
                    **tables.same_named(pending, _SIGN_IN_AS_STORED),
                    secrets=self._keys.seal(secrets, _sign_in_context(pending.state_digest)),
                    metadata=pending.metadata_json,
                    create_time_us=now,
                    expire_time_us=tables.to_us(pending.expire_time),
                    used_time_us=None,
                )
            )

    def spend_sign_in(
        self, state_digest: str, check: Callable[[PendingSignIn, int | None], None]
    ) -> PendingSignIn | None:
        table = tables.oauth_sign_ins
        connections = tables.connections
        with write_transaction(self._engine) as conn:
            row = conn.execute(
                select(table).where(table.c.state_digest == state_digest).with_for_update()
            ).first()
            if row is None:
                return None
            revision = conn.execute(
                select(connections.c.revision).where(
                    connections.c.tenant == row.tenant,
                    connections.c.name == row.name,
                    connections.c.delete_time_us.is_(None),
                )
            ).scalar()
            pending = self._pending(row)
            check(pending, revision)
            conn.execute(
                update(table)
                .where(table.c.state_digest == state_digest)
                .values(used_time_us=tables.now_us())
            )
        return pending

    def _pending(self, row: Row[object]) -> PendingSignIn:
        secrets = json.loads(self._keys.open(row.secrets, _sign_in_context(row.state_digest)))
        return PendingSignIn(
            **tables.same_named(row, _SIGN_IN_AS_STORED),
            expire_time=tables.from_us(row.expire_time_us),
            verifier=secrets["verifier"],
            client_json=secrets["client"],
            metadata_json=row.metadata,
            used_time=None if row.used_time_us is None else tables.from_us(row.used_time_us),
        )

    # Grants

    def get_grant(self, tenant: str, name: str) -> OAuthGrant | None:
        table = tables.oauth_grants
        with read_transaction(self._engine) as conn:
            row = conn.execute(select(table).where(*grant_row(tenant, name))).first()
        return None if row is None else self._grant(row)

    def put_grant(self, tenant: str, name: str, grant: OAuthGrant) -> None:
        table = tables.oauth_grants
        with write_transaction(self._engine) as conn:
            # A grant from a sign-in or a first client-credentials request: no refresh
            # claimed of the one it replaces may store over it.
            values = {**self._grant_values(tenant, name, grant), **_NO_CLAIM}
            key = grant_row(tenant, name)
            found = conn.execute(select(table.c.tenant).where(*key).with_for_update()).first()
            if found is not None:
                _update_grant(conn, tenant, name, values)
            else:
                conn.execute(insert(table).values(tenant=tenant, name=name, **values))

    def renew_grant(
        self, tenant: str, name: str, renew: Callable[[OAuthGrant], OAuthGrant]
    ) -> OAuthGrant | None:
        """Lock the grant's row, read it again, and store what `renew` makes of it (`renew`
        returns its argument when there is nothing to change).
        None when the connection has no grant."""
        with write_transaction(self._engine) as conn:
            row = _locked_grant_row(conn, tenant, name)
            if row is None:
                return None
            current = self._grant(row)
            renewed = renew(current)
            if renewed is not current:
                _update_grant(conn, tenant, name, self._grant_values(tenant, name, renewed))
        return renewed

    def claim_refresh(
        self,
        tenant: str,
        name: str,
        claimant: str,
        claim_seconds: float,
        needs_refresh: Callable[[OAuthGrant], bool],
    ) -> RefreshClaim | None:
        table = tables.oauth_grants
        with write_transaction(self._engine) as conn:
            row = _locked_grant_row(conn, tenant, name)
            if row is None:
                return None
            current = self._grant(row)
            if not needs_refresh(current):
                return RefreshClaim(current)
            now = tables.now_us()
            claimed_until = row.refresh_claim_until_us
            if row.refresh_claimant not in (None, claimant) and claimed_until > now:
                return RefreshClaim(current, held_elsewhere=True)
            conn.execute(
                update(table)
                .where(*grant_row(tenant, name))
                .values(
                    refresh_claimant=claimant,
                    refresh_claim_until_us=now + int(claim_seconds * 1_000_000),
                )
            )
        return RefreshClaim(current, claimed=True)

    def store_refreshed(
        self, tenant: str, name: str, claimant: str, grant: OAuthGrant
    ) -> OAuthGrant | None:
        with write_transaction(self._engine) as conn:
            row = _locked_grant_row(conn, tenant, name)
            if row is None:
                return None
            if row.refresh_claimant != claimant:
                return self._grant(row)
            values = {**self._grant_values(tenant, name, grant), **_NO_CLAIM}
            _update_grant(conn, tenant, name, values)
        return grant

    def release_refresh(self, tenant: str, name: str, claimant: str) -> None:
        table = tables.oauth_grants
        with write_transaction(self._engine) as conn:
            conn.execute(
                update(table)
                .where(*grant_row(tenant, name), table.c.refresh_claimant == claimant)
                .values(**_NO_CLAIM)
            )

    def _grant_values(self, tenant: str, name: str, grant: OAuthGrant) -> dict[str, object]:
        """The grant's columns, sealed (the refresh claim's are not among them)."""
        return {
            "revision": grant.revision,
            "tokens": self._keys.seal(grant.tokens_json, _grant_context(tenant, name, "tokens")),
            "client": self._keys.seal(grant.client_json, _grant_context(tenant, name, "client")),
            "metadata": grant.metadata_json,
            "expire_time_us": (
                None if grant.expire_time is None else tables.to_us(grant.expire_time)
            ),
            "authorization_reason": (
                None if grant.authorization_reason is None else grant.authorization_reason.value
            ),
            "update_time_us": tables.now_us(),
        }

    def _grant(self, row: Row[object]) -> OAuthGrant:
        return OAuthGrant(
            revision=row.revision,
            tokens_json=self._keys.open(row.tokens, _grant_context(row.tenant, row.name, "tokens")),
            client_json=self._keys.open(row.client, _grant_context(row.tenant, row.name, "client")),
            metadata_json=row.metadata,
            expire_time=None if row.expire_time_us is None else tables.from_us(row.expire_time_us),
            authorization_reason=(
                None
                if row.authorization_reason is None
                else AuthorizationReason(row.authorization_reason)
            ),
        )


def _update_grant(conn: SqlConnection, tenant: str, name: str, values: dict[str, object]) -> None:
    table = tables.oauth_grants
    conn.execute(update(table).where(*grant_row(tenant, name)).values(**values))


def _locked_grant_row(conn: SqlConnection, tenant: str, name: str) -> Row[Any] | None:
    """The grant's row, read with its lock taken (FOR UPDATE; SQLite's write transaction)."""
    table = tables.oauth_grants
    return conn.execute(select(table).where(*grant_row(tenant, name)).with_for_update()).first()


# The sealed fields of the OAuth tables, with how each row's key is named in its context:
# rekey and the start-up check cover them as they cover the connections' own secrets.
def _sealed_fields() -> list[tuple[Table, tuple[str, ...], str, Callable[[Any], bytes]]]:
    grants, sign_ins = tables.oauth_grants, tables.oauth_sign_ins
    return [
        (
            grants,
            ("tenant", "name"),
            "tokens",
            lambda r: _grant_context(r.tenant, r.name, "tokens"),
        ),
        (
            grants,
            ("tenant", "name"),
            "client",
            lambda r: _grant_context(r.tenant, r.name, "client"),
        ),
        (sign_ins, ("state_digest",), "secrets", lambda r: _sign_in_context(r.state_digest)),
    ]


def check_oauth_secrets(engine: Engine, keys: KeyRing) -> int:
    """Open every sealed OAuth field (SecretUnreadable names the row, never a secret); how
    many were opened."""
    opened = 0
    for table, key, field, where in _sealed_fields():
        with read_transaction(engine) as conn:
            rows = conn.execute(select(*(table.c[k] for k in key), table.c[field])).all()
        for row in rows:
            try:
                keys.open(getattr(row, field), where(row))
            except SecretUnreadable as error:
                named = ", ".join(str(getattr(row, k)) for k in key)
                raise SecretUnreadable(f"{table.name} ({named}), {field}: {error}") from None
            opened += 1
    return opened


def reseal_oauth_secrets(engine: Engine, keys: KeyRing) -> tuple[int, int]:
    """Seal every OAuth field under the primary key, one locked row at a time: (resealed,
    already under it)."""
    resealed = already = 0
    for table, key, field, where in _sealed_fields():
        with read_transaction(engine) as conn:
            names = conn.execute(select(*(table.c[k] for k in key))).all()
        for name in names:
            match = [table.c[k] == value for k, value in zip(key, name, strict=True)]
            with write_transaction(engine) as conn:
                erase_freed_content(conn)
                row = conn.execute(
                    select(*(table.c[k] for k in key), table.c[field])
                    .where(*match)
                    .with_for_update()
                ).first()
                if row is None:
                    continue
                stored = getattr(row, field)
                if not keys.needs_resealing(stored):
                    already += 1
                    continue
                sealed = keys.seal(keys.open(stored, where(row)), where(row))
                conn.execute(update(table).where(*match).values({field: sealed}))
                resealed += 1
    settle_freed_content(engine)
    return resealed, already

"""SqlConnectionStore: connections in SQL, their versions and sealed secrets; their tool
catalogue is SqlCatalogs (storage/catalogs.py).

A connection's env and headers are stored sealed (psych_sidecar.secrets): each field is one
envelope of its JSON, bound to its tenant, name and field. They are sealed and opened here, at
the row boundary; nothing above storage sees an envelope, nothing below it a secret."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, Engine, Row, Select, and_, delete, insert, select, update

from psych_sidecar.domain.catalog import (
    AuthKind,
    ClientKind,
    Connection,
    OAuthSettings,
    StoredConnection,
    TransportKind,
)
from psych_sidecar.secrets.cipher import KeyRing, SecretUnreadable, context
from psych_sidecar.storage import tables
from psych_sidecar.storage.catalogs import (
    SqlCatalogs,
    append_catalog_version,
    connection_row,
    stored_json,
    stored_rejections,
)
from psych_sidecar.storage.engines import erase_freed_content, settle_freed_content
from psych_sidecar.storage.loop_connection import LoopConnection
from psych_sidecar.storage.oauth import check_oauth_secrets, grant_row, reseal_oauth_secrets
from psych_sidecar.storage.statements import driver_statements
from psych_sidecar.storage.transactions import plain_select, read_transaction, write_transaction

# The fields of a connection's row that hold secrets, sealed one envelope each.
SECRET_FIELDS = ("env", "headers", "auth_secrets")


def secret_context(tenant: str, name: str, field: str) -> bytes:
    """Where a connection's secret field is stored: its envelope opens only there."""
    return context("connections", tenant, name, field)


def _auth_json(auth: OAuthSettings | None) -> str:
    if auth is None:
        return ""
    shown = auth.without_secrets()
    return stored_json(
        {
            "kind": shown.kind.value,
            "client_kind": shown.client_kind.value,
            "client_name": shown.client_name,
            "client_metadata_url": shown.client_metadata_url,
            "redirect_uri": shown.redirect_uri,
            "client_id": shown.client_id,
            "scopes": list(shown.scopes),
            "algorithm": auth.algorithm,
            "resource": shown.resource,
            "issuer": shown.issuer,
        }
    )


def _auth(row: Row[Any], keys: KeyRing | None) -> OAuthSettings | None:
    if not row.auth:
        return None
    shown = json.loads(row.auth)
    secrets: dict[str, str] = {}
    if keys is not None and row.auth_secrets is not None:
        where = secret_context(row.tenant, row.name, "auth_secrets")
        secrets = json.loads(keys.open(row.auth_secrets, where))
    return OAuthSettings(
        kind=AuthKind(shown["kind"]),
        client_kind=ClientKind(shown["client_kind"]),
        client_name=shown["client_name"],
        client_metadata_url=shown["client_metadata_url"],
        redirect_uri=shown["redirect_uri"],
        client_id=shown["client_id"],
        scopes=tuple(shown["scopes"]),
        algorithm=shown["algorithm"],
        resource=shown["resource"],
        issuer=shown["issuer"],
        client_secret=secrets.get("client_secret", ""),
        private_key_pem=secrets.get("private_key_pem", ""),
    )


def _connection_values(connection: Connection, keys: KeyRing) -> dict[str, Any]:
    def sealed(field: str, value: Mapping[str, str]) -> str:
        where = secret_context(connection.tenant, connection.name, field)
        return keys.seal(stored_json(dict(value)), where)

    auth = connection.auth
    auth_secrets = None
    if auth is not None and auth.secrets():
        auth_secrets = sealed(
            "auth_secrets",
            {"client_secret": auth.client_secret, "private_key_pem": auth.private_key_pem},
        )

    return {
        "transport": connection.transport.value,
        "command": connection.command,
        "args": stored_json(list(connection.args)),
        "env": sealed("env", connection.env),
        "url": connection.url,
        "headers": sealed("headers", connection.headers),
        "auth": _auth_json(auth),
        "auth_secrets": auth_secrets,
        "preload": connection.preload,
        "eager_tools": stored_json(list(connection.eager_tools)),
        "description": connection.description,
        "allow_tools": stored_json(list(connection.allow_tools)),
        "deny_tools": stored_json(list(connection.deny_tools)),
    }


def _with_rejections() -> Select[Any]:
    """A connection's row, with the rejections of its current catalogue version."""
    table, versions = tables.connections, tables.catalog_versions
    current = and_(
        versions.c.tenant == table.c.tenant,
        versions.c.server == table.c.name,
        versions.c.catalog_version == table.c.catalog_version,
    )
    return select(table, versions.c.rejected_tool_count, versions.c.rejected_tools).select_from(
        table.outerjoin(versions, current)
    )


def _opened(row: Row[Any], field: str, keys: KeyRing | None) -> dict[str, str]:
    if keys is None:
        return {}
    opened: dict[str, str] = json.loads(
        keys.open(getattr(row, field), secret_context(row.tenant, row.name, field))
    )
    return opened


def _stored(row: Row[Any], keys: KeyRing | None) -> StoredConnection:
    return StoredConnection(
        connection=Connection(
            tenant=row.tenant,
            name=row.name,
            transport=TransportKind(row.transport),
            command=row.command,
            args=tuple(json.loads(row.args)),
            env=_opened(row, "env", keys),
            url=row.url,
            headers=_opened(row, "headers", keys),
            auth=_auth(row, keys),
            preload=row.preload,
            eager_tools=tuple(json.loads(row.eager_tools)),
            description=row.description,
            allow_tools=tuple(json.loads(row.allow_tools)),
            deny_tools=tuple(json.loads(row.deny_tools)),
        ),
        revision=row.revision,
        catalog_version=row.catalog_version,
        update_time=tables.from_us(row.update_time_us),
        rejected=stored_rejections(row.rejected_tool_count, row.rejected_tools),
    )


class SqlConnectionStore(SqlCatalogs):
    """Implements ConnectionRepository (its catalogue in SqlCatalogs). Every method is one
    transaction.

    `keys` seal and open the secret fields. A reader that shows no secret (the read-only
    inspector) passes None: its connections come back with empty env and headers, and it
    cannot write one."""

    def __init__(self, engine: Engine, keys: KeyRing | None) -> None:
        super().__init__(engine)
        self._keys = keys
        self._versions_sql = driver_statements(engine).connection_versions

    def _binary(self, column: ColumnElement[str]) -> ColumnElement[str]:
        """Order by code point on both databases (SQLite's default; PostgreSQL's "C")."""
        if self._engine.dialect.name == "postgresql":
            return column.collate("C")
        return column

    def put_connection(self, connection: Connection) -> StoredConnection:
        table = tables.connections
        key = connection_row(connection.tenant, connection.name)
        values = _connection_values(connection, self._require_keys())
        now = tables.now_us()
        with write_transaction(self._engine) as conn:
            row = conn.execute(
                select(table.c.revision, table.c.url, table.c.auth, table.c.delete_time_us)
                .where(*key)
                .with_for_update()
            ).first()
            if row is None or (
                row.delete_time_us is not None
                or (row.url, row.auth) != (values["url"], values["auth"])
            ):
                # Tokens are for the server and client they were granted to, and no other.
                conn.execute(
                    delete(tables.oauth_grants).where(
                        *grant_row(connection.tenant, connection.name)
                    )
                )
            if row is None:
                conn.execute(
                    insert(table).values(
                        tenant=connection.tenant,
                        name=connection.name,
                        revision=1,
                        catalog_version=0,
                        create_time_us=now,
                        update_time_us=now,
                        delete_time_us=None,
                        **values,
                    )
                )
            else:
                conn.execute(
                    update(table)
                    .where(*key)
                    .values(
                        revision=row.revision + 1,
                        update_time_us=now,
                        delete_time_us=None,
                        **values,
                    )
                )
            stored = conn.execute(_with_rejections().where(*key)).one()
        return _stored(stored, self._keys)

    def delete_connection(self, tenant: str, name: str) -> bool:
        table = tables.connections
        key = connection_row(tenant, name)
        with write_transaction(self._engine) as conn:
            row = conn.execute(
                select(table.c.revision, table.c.catalog_version)
                .where(*key, table.c.delete_time_us.is_(None))
                .with_for_update()
            ).first()
            if row is None:
                return False
            now = tables.now_us()
            conn.execute(
                update(table)
                .where(*key)
                .values(
                    revision=row.revision + 1,
                    env="{}",
                    headers="{}",
                    auth_secrets=None,
                    update_time_us=now,
                    delete_time_us=now,
                )
            )
            conn.execute(delete(tables.oauth_grants).where(*grant_row(tenant, name)))
            if row.catalog_version > 0:
                # Its tools leave every surface: an empty version supersedes the last one.
                append_catalog_version(conn, tenant, name, row.catalog_version, [], now)
        return True

    def get_connection(self, tenant: str, name: str) -> StoredConnection | None:
        table = tables.connections
        with read_transaction(self._engine) as conn:
            row = conn.execute(
                _with_rejections().where(
                    *connection_row(tenant, name), table.c.delete_time_us.is_(None)
                )
            ).first()
        return None if row is None else _stored(row, self._keys)

    def list_connections(
        self, tenant: str, after_name: str, limit: int
    ) -> tuple[list[StoredConnection], bool]:
        table = tables.connections
        name = self._binary(table.c.name)
        with read_transaction(self._engine) as conn:
            rows = conn.execute(
                _with_rejections()
                .where(
                    table.c.tenant == tenant,
                    name > after_name,
                    table.c.delete_time_us.is_(None),
                )
                .order_by(name)
                .limit(limit + 1)
            ).all()
        return [_stored(row, self._keys) for row in rows[:limit]], len(rows) > limit

    def all_connections(self) -> list[StoredConnection]:
        table = tables.connections
        with read_transaction(self._engine) as conn:
            rows = conn.execute(
                _with_rejections()
                .where(table.c.delete_time_us.is_(None))
                .order_by(table.c.tenant, table.c.name)
            ).all()
        return [_stored(row, self._keys) for row in rows]

    def check_secrets(self) -> int:
        """Open every live connection's secrets, so that a missing or wrong key is found at
        start rather than by the first call to that server. Raises SecretUnreadable naming
        the connection and the key (never a secret); returns how many fields were opened."""
        keys = self._require_keys()
        table = tables.connections
        with read_transaction(self._engine) as conn:
            rows = conn.execute(
                select(
                    table.c.tenant, table.c.name, table.c.env, table.c.headers, table.c.auth_secrets
                ).where(table.c.delete_time_us.is_(None))
            ).all()
        opened = 0
        for row in rows:
            for field in SECRET_FIELDS:
                if getattr(row, field) is None:
                    continue
                opened += 1
                try:
                    keys.open(getattr(row, field), secret_context(row.tenant, row.name, field))
                except SecretUnreadable as error:
                    raise SecretUnreadable(
                        f"connection {row.name!r} of tenant {row.tenant!r}, {field}: {error}"
                    ) from None
        return opened + check_oauth_secrets(self._engine, keys)

    def reseal_secrets(self) -> tuple[int, int]:
        """Seal every live connection's secrets under the primary key: (fields resealed,
        fields already under it). One short transaction per connection, its row locked and
        read again inside, so sidecars serving meanwhile lose no write; a field already under
        the primary key is left alone, so running it again does nothing. The revision is
        unchanged (the secrets are), so no session reconnects. On SQLite the replaced
        envelopes are zeroed in the file, not left in its free space."""
        keys = self._require_keys()
        table = tables.connections
        with read_transaction(self._engine) as conn:
            names = conn.execute(
                select(table.c.tenant, table.c.name).where(table.c.delete_time_us.is_(None))
            ).all()
        resealed = already = 0
        for tenant, name in names:
            key = connection_row(tenant, name)
            with write_transaction(self._engine) as conn:
                erase_freed_content(conn)
                row = conn.execute(
                    select(table.c.env, table.c.headers, table.c.auth_secrets)
                    .where(*key, table.c.delete_time_us.is_(None))
                    .with_for_update()
                ).first()
                if row is None:  # deleted meanwhile: its secrets went with it
                    continue
                values: dict[str, str] = {}
                for field in SECRET_FIELDS:
                    stored = getattr(row, field)
                    if stored is None:
                        continue
                    if not keys.needs_resealing(stored):
                        already += 1
                        continue
                    where = secret_context(tenant, name, field)
                    values[field] = keys.seal(keys.open(stored, where), where)
                if values:
                    conn.execute(update(table).where(*key).values(**values))
                    resealed += len(values)
        settle_freed_content(self._engine)
        oauth_resealed, oauth_already = reseal_oauth_secrets(self._engine, keys)
        return resealed + oauth_resealed, already + oauth_already

    def _require_keys(self) -> KeyRing:
        if self._keys is None:
            raise RuntimeError("this connection store was given no keys")
        return self._keys

    def connection_versions(self, tenant: str) -> dict[str, tuple[int, int]]:
        # Every ResolveTurn and tool call runs this.
        return _versions(plain_select(self._engine, self._versions_sql, (tenant,)))

    def connection_versions_now(
        self, loop: LoopConnection, tenant: str
    ) -> dict[str, tuple[int, int]] | None:
        """`connection_versions` on the event loop's connection, or None when not now."""
        rows = loop.select_now(self._versions_sql, (tenant,))
        return None if rows is None else _versions(rows)


def _versions(rows: list[Any]) -> dict[str, tuple[int, int]]:
    return {name: (revision, version) for name, revision, version in rows}

"""SqlConnectionStore: connections and the versioned, soft-delete catalogue in SQL.

A connection's env and headers are stored sealed (psych_sidecar.secrets): each field is one
envelope of its JSON, bound to its tenant, name and field. They are sealed and opened here, at
the row boundary; nothing above storage sees an envelope, nothing below it a secret."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Engine, Row, Select, and_, delete, insert, select, update
from sqlalchemy import Connection as SqlConnection

from psych_sidecar.domain.catalog import (
    NO_REJECTIONS,
    AuthKind,
    CatalogTool,
    CatalogVersion,
    CatalogWrite,
    ClientKind,
    Connection,
    OAuthSettings,
    Rejections,
    StoredConnection,
    TransportKind,
    listing_fingerprint,
    rejected_tool,
)
from psych_sidecar.secrets.cipher import KeyRing, SecretUnreadable, context
from psych_sidecar.storage import tables
from psych_sidecar.storage.engines import erase_freed_content, settle_freed_content
from psych_sidecar.storage.loop_connection import LoopConnection
from psych_sidecar.storage.oauth import check_oauth_secrets, reseal_oauth_secrets
from psych_sidecar.storage.statements import driver_statements
from psych_sidecar.storage.transactions import plain_select, transaction

# Rows per INSERT: large catalogues (a thousand tools and more) go in a few round trips.
_INSERT_BATCH = 500


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


# The fields of a connection's row that hold secrets, sealed one envelope each.
SECRET_FIELDS = ("env", "headers", "auth_secrets")


def secret_context(tenant: str, name: str, field: str) -> bytes:
    """Where a connection's secret field is stored: its envelope opens only there."""
    return context("connections", tenant, name, field)


def _auth_json(auth: OAuthSettings | None) -> str:
    if auth is None:
        return ""
    shown = auth.without_secrets()
    return _dump(
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
        return keys.seal(_dump(dict(value)), where)

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
        "args": _dump(list(connection.args)),
        "env": sealed("env", connection.env),
        "url": connection.url,
        "headers": sealed("headers", connection.headers),
        "auth": _auth_json(auth),
        "auth_secrets": auth_secrets,
        "preload": connection.preload,
        "eager_tools": _dump(list(connection.eager_tools)),
        "description": connection.description,
        "allow_tools": _dump(list(connection.allow_tools)),
        "deny_tools": _dump(list(connection.deny_tools)),
    }


def _rejections_json(rejected: Rejections) -> str:
    return _dump([[item.name, item.reason] for item in rejected.tools])


def _rejections(count: int | None, listed: str | None) -> Rejections:
    """A version's rejections as stored; none for a connection with no version yet."""
    if not count or listed is None:
        return NO_REJECTIONS
    return Rejections(
        tuple(rejected_tool(name, reason) for name, reason in json.loads(listed)), count
    )


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
        rejected=_rejections(row.rejected_tool_count, row.rejected_tools),
    )


def _tool(row: Row[Any], server: str) -> CatalogTool:
    return CatalogTool(
        server=server,
        name=row.name,
        description=row.description,
        input_schema_json=bytes(row.input_schema),
        output_schema_json=bytes(row.output_schema),
        annotations_json=bytes(row.annotations),
        catalog_version=row.catalog_version,
        removed_in_version=row.removed_in_version,
    )


class SqlConnectionStore:
    """Implements ConnectionRepository. Every method is one transaction.

    `keys` seal and open the secret fields. A reader that shows no secret (the read-only
    inspector) passes None: its connections come back with empty env and headers, and it
    cannot write one."""

    def __init__(self, engine: Engine, keys: KeyRing | None) -> None:
        self._engine = engine
        self._keys = keys
        self._versions_sql = driver_statements(engine).connection_versions

    def _binary(self, column: ColumnElement[str]) -> ColumnElement[str]:
        """Order by code point on both databases (SQLite's default; PostgreSQL's "C")."""
        if self._engine.dialect.name == "postgresql":
            return column.collate("C")
        return column

    def put_connection(self, connection: Connection) -> StoredConnection:
        table = tables.connections
        key = (table.c.tenant == connection.tenant, table.c.name == connection.name)
        values = _connection_values(connection, self._require_keys())
        now = tables.now_us()
        with transaction(self._engine, write=True) as conn:
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
                grants = tables.oauth_grants
                conn.execute(
                    delete(grants).where(
                        grants.c.tenant == connection.tenant, grants.c.name == connection.name
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
        key = (table.c.tenant == tenant, table.c.name == name)
        with transaction(self._engine, write=True) as conn:
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
            grants = tables.oauth_grants
            conn.execute(delete(grants).where(grants.c.tenant == tenant, grants.c.name == name))
            if row.catalog_version > 0:
                # Its tools leave every surface: an empty version supersedes the last one.
                self._append_version(conn, tenant, name, row.catalog_version, [], now)
        return True

    def get_connection(self, tenant: str, name: str) -> StoredConnection | None:
        table = tables.connections
        with transaction(self._engine, write=False) as conn:
            row = conn.execute(
                _with_rejections().where(
                    table.c.tenant == tenant,
                    table.c.name == name,
                    table.c.delete_time_us.is_(None),
                )
            ).first()
        return None if row is None else _stored(row, self._keys)

    def list_connections(
        self, tenant: str, after_name: str, limit: int
    ) -> tuple[list[StoredConnection], bool]:
        table = tables.connections
        name = self._binary(table.c.name)
        with transaction(self._engine, write=False) as conn:
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
        with transaction(self._engine, write=False) as conn:
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
        with transaction(self._engine, write=False) as conn:
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
        with transaction(self._engine, write=False) as conn:
            names = conn.execute(
                select(table.c.tenant, table.c.name).where(table.c.delete_time_us.is_(None))
            ).all()
        resealed = already = 0
        for tenant, name in names:
            key = (table.c.tenant == tenant, table.c.name == name)
            with transaction(self._engine, write=True) as conn:
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

    def write_catalog(
        self,
        tenant: str,
        server: str,
        revision: int,
        tools: Sequence[CatalogTool],
        rejected: Rejections = NO_REJECTIONS,
    ) -> CatalogWrite | None:
        table, versions = tables.connections, tables.catalog_versions
        fingerprint = listing_fingerprint(tools, rejected)
        with transaction(self._engine, write=True) as conn:
            # Locking the connection's row serialises refreshes, across sidecars too.
            current = conn.execute(
                select(table.c.catalog_version)
                .where(
                    table.c.tenant == tenant,
                    table.c.name == server,
                    table.c.revision == revision,
                    table.c.delete_time_us.is_(None),
                )
                .with_for_update()
            ).scalar()
            if current is None:
                return None
            if current > 0:
                previous = conn.execute(
                    select(versions.c.fingerprint).where(
                        versions.c.tenant == tenant,
                        versions.c.server == server,
                        versions.c.catalog_version == current,
                    )
                ).scalar()
                if previous == fingerprint:
                    return CatalogWrite(current, len(tools), False, rejected.count)
            version = self._append_version(
                conn, tenant, server, current, tools, tables.now_us(), rejected
            )
        return CatalogWrite(version, len(tools), True, rejected.count)

    @staticmethod
    def _append_version(
        conn: SqlConnection,
        tenant: str,
        server: str,
        current: int,
        tools: Sequence[CatalogTool],
        now: int,
        rejected: Rejections = NO_REJECTIONS,
    ) -> int:
        """Write every tool at a new version, then mark all older current rows removed as of
        it, in one statement. The caller holds the connection's row lock. Rejected tools are
        kept with the version only, never as catalogue rows: one that becomes valid later is
        an added tool, one that becomes invalid a removed one."""
        catalog, versions = tables.catalog_tools, tables.catalog_versions
        version = current + 1
        conn.execute(
            insert(versions).values(
                tenant=tenant,
                server=server,
                catalog_version=version,
                tool_count=len(tools),
                fingerprint=listing_fingerprint(tools, rejected),
                create_time_us=now,
                rejected_tool_count=rejected.count,
                rejected_tools=_rejections_json(rejected),
            )
        )
        rows = [
            {
                "tenant": tenant,
                "server": server,
                "catalog_version": version,
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.input_schema_json,
                "output_schema": tool.output_schema_json,
                "annotations": tool.annotations_json,
                "removed_in_version": 0,
            }
            for tool in tools
        ]
        for start in range(0, len(rows), _INSERT_BATCH):
            conn.execute(insert(catalog), rows[start : start + _INSERT_BATCH])
        conn.execute(
            update(catalog)
            .where(
                catalog.c.tenant == tenant,
                catalog.c.server == server,
                catalog.c.removed_in_version == 0,
                catalog.c.catalog_version < version,
            )
            .values(removed_in_version=version)
        )
        conn.execute(
            update(tables.connections)
            .where(tables.connections.c.tenant == tenant, tables.connections.c.name == server)
            .values(catalog_version=version)
        )
        return version

    def catalog_tools(
        self, tenant: str, server: str, version: int
    ) -> tuple[int, list[CatalogTool]] | None:
        table, versions, catalog = (
            tables.connections,
            tables.catalog_versions,
            tables.catalog_tools,
        )
        query = select(catalog).where(catalog.c.tenant == tenant, catalog.c.server == server)
        with transaction(self._engine, write=False) as conn:
            if version == 0:
                current = conn.execute(
                    select(table.c.catalog_version).where(
                        table.c.tenant == tenant, table.c.name == server
                    )
                ).scalar()
                if current is None:
                    return None
                # The current catalogue is what carries no removal marker.
                rows = conn.execute(query.where(catalog.c.removed_in_version == 0)).all()
                version = rows[0].catalog_version if rows else current
            else:
                exists = conn.execute(
                    select(versions.c.catalog_version).where(
                        versions.c.tenant == tenant,
                        versions.c.server == server,
                        versions.c.catalog_version == version,
                    )
                ).first()
                if exists is None:
                    return None
                rows = conn.execute(query.where(catalog.c.catalog_version == version)).all()
        # Sorted here, not in SQL: a database's collation must not decide the order.
        return version, sorted((_tool(row, server) for row in rows), key=lambda t: t.name)

    def catalog_versions(
        self, tenant: str, server: str, before_version: int, limit: int
    ) -> tuple[list[CatalogVersion], bool] | None:
        table, versions = tables.connections, tables.catalog_versions
        query = select(versions).where(versions.c.tenant == tenant, versions.c.server == server)
        if before_version:
            query = query.where(versions.c.catalog_version < before_version)
        query = query.order_by(versions.c.catalog_version.desc()).limit(limit + 1)
        with transaction(self._engine, write=False) as conn:
            known = conn.execute(
                select(table.c.name).where(table.c.tenant == tenant, table.c.name == server)
            ).first()
            if known is None:
                return None
            rows = conn.execute(query).all()
        listed = [
            CatalogVersion(
                catalog_version=row.catalog_version,
                tool_count=row.tool_count,
                sha256=row.fingerprint,
                create_time=tables.from_us(row.create_time_us),
                rejected_count=row.rejected_tool_count,
            )
            for row in rows[:limit]
        ]
        return listed, len(rows) > limit


def _versions(rows: list[Any]) -> dict[str, tuple[int, int]]:
    return {name: (revision, version) for name, revision, version in rows}

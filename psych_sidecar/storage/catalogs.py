"""The connections' versioned, soft-delete tool catalogue in SQL: a refresh writes a new
version and marks every older tool removed as of it; reads by version, and the versions' list."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Row, insert, select, update

from psych_sidecar.domain.catalog import (
    NO_REJECTIONS,
    CatalogTool,
    CatalogVersion,
    CatalogWrite,
    Rejections,
    listing_fingerprint,
    rejected_tool,
)
from psych_sidecar.storage import tables
from psych_sidecar.storage.transactions import read_transaction, write_transaction

# Rows per INSERT: large catalogues (a thousand tools and more) go in a few round trips.
_INSERT_BATCH = 500


def stored_json(value: Any) -> str:
    """JSON as the connection and catalogue rows hold it: compact, keys sorted."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _rejections_json(rejected: Rejections) -> str:
    return stored_json([[item.name, item.reason] for item in rejected.tools])


def stored_rejections(count: int | None, listed: str | None) -> Rejections:
    """A version's rejections as stored; none for a connection with no version yet."""
    if not count or listed is None:
        return NO_REJECTIONS
    return Rejections(
        tuple(rejected_tool(name, reason) for name, reason in json.loads(listed)), count
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


def connection_row(tenant: str, server: str) -> tuple[ColumnElement[bool], ...]:
    """The connection's row, live or deleted."""
    table = tables.connections
    return (table.c.tenant == tenant, table.c.name == server)


def _version_row(tenant: str, server: str, version: int) -> tuple[ColumnElement[bool], ...]:
    versions = tables.catalog_versions
    return (
        versions.c.tenant == tenant,
        versions.c.server == server,
        versions.c.catalog_version == version,
    )


class SqlCatalogs:
    """ConnectionRepository's catalogue: its tools and versions. Every method is one
    transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

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
        with write_transaction(self._engine) as conn:
            # Locking the connection's row serialises refreshes, across sidecars too.
            current = conn.execute(
                select(table.c.catalog_version)
                .where(
                    *connection_row(tenant, server),
                    table.c.revision == revision,
                    table.c.delete_time_us.is_(None),
                )
                .with_for_update()
            ).scalar()
            if current is None:
                return None
            if current > 0:
                previous = conn.execute(
                    select(versions.c.fingerprint).where(*_version_row(tenant, server, current))
                ).scalar()
                if previous == fingerprint:
                    return CatalogWrite(current, len(tools), False, rejected.count)
            version = append_catalog_version(
                conn, tenant, server, current, tools, tables.now_us(), rejected
            )
        return CatalogWrite(version, len(tools), True, rejected.count)

    def catalog_tools(
        self, tenant: str, server: str, version: int
    ) -> tuple[int, list[CatalogTool]] | None:
        table, versions, catalog = (
            tables.connections,
            tables.catalog_versions,
            tables.catalog_tools,
        )
        query = select(catalog).where(catalog.c.tenant == tenant, catalog.c.server == server)
        with read_transaction(self._engine) as conn:
            if version == 0:
                current = conn.execute(
                    select(table.c.catalog_version).where(*connection_row(tenant, server))
                ).scalar()
                if current is None:
                    return None
                # The current catalogue is what carries no removal marker.
                rows = conn.execute(query.where(catalog.c.removed_in_version == 0)).all()
                version = rows[0].catalog_version if rows else current
            else:
                exists = conn.execute(
                    select(versions.c.catalog_version).where(*_version_row(tenant, server, version))
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
        with read_transaction(self._engine) as conn:
            known = conn.execute(
                select(table.c.name).where(*connection_row(tenant, server))
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


def append_catalog_version(
    conn: Connection,
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
        .where(*connection_row(tenant, server))
        .values(catalog_version=version)
    )
    return version

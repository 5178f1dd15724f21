"""Deleting Runs and a tenant's data (the domain's RunDeletionRepository): each Run in one
write transaction that first takes the Run's row, as every append does, so an append either
lands before the deletion (and is deleted with the Run) or finds no Run (RUN_NOT_FOUND).

On SQLite the freed pages are zeroed (secure_delete), so the content is not left readable in
the file's free space; `reclaim_space` gives them back to the file system (VACUUM). On
PostgreSQL the deleted row versions stay in the table files until VACUUM (autovacuum, or
`reclaim_space`) marks their space free for reuse (docs/operations.md, Deleting data)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Engine, Table, delete, func, select, text

from psych_sidecar.domain.runlog import DeletedRun, ExpiryHeld, TenantSettingsDeleted
from psych_sidecar.storage import tables
from psych_sidecar.storage.engines import erase_freed_content, settle_freed_content
from psych_sidecar.storage.transactions import read_transaction, write_transaction

# Every table holding a Run's rows besides `runs`, children before their parents.
RUN_TABLES = (
    tables.record_parts,
    tables.records,
    tables.append_requests,
    tables.usage_events,
    tables.turn_surfaces,
    tables.assembly_journal,
    tables.tool_tasks,
    tables.tool_input_rounds,
)
# Any constant works; it only has to be the same in every sidecar sharing a database.
_EXPIRY_LOCK_KEY = 0x7073_6964_6578_7069  # "psidexpi"


class RunDeletions:
    """Implements RunDeletionRepository over SQLAlchemy Core."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def delete_run(self, run_id: str) -> DeletedRun | None:
        with write_transaction(self._engine) as conn:
            return _delete_run(conn, run_id)

    def delete_expired_run(self, created_before: datetime) -> DeletedRun | ExpiryHeld | None:
        runs = tables.runs
        cutoff = tables.to_us(created_before)
        with write_transaction(self._engine) as conn:
            # One deleter at a time across sidecars: a transaction's lock (nothing left on the
            # session, so it holds through PgBouncer in transaction mode too). SQLite's write
            # transaction is one at a time already.
            if (
                conn.dialect.name == "postgresql"
                and not conn.execute(
                    text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": _EXPIRY_LOCK_KEY}
                ).scalar_one()
            ):
                return ExpiryHeld.ELSEWHERE
            oldest = conn.execute(
                select(runs.c.run_id)
                .where(runs.c.create_time_us < cutoff)
                .order_by(runs.c.create_time_us, runs.c.run_id)
                .limit(1)
            ).scalar()
            if oldest is None:
                return None
            return _delete_run(conn, str(oldest))

    def tenant_run_ids(self, tenant: str, limit: int) -> list[str]:
        runs = tables.runs
        query = select(runs.c.run_id).where(runs.c.tenant == tenant).limit(limit)
        with read_transaction(self._engine) as conn:
            return [str(run_id) for (run_id,) in conn.execute(query)]

    def delete_tenant_settings(self, tenant: str) -> TenantSettingsDeleted:
        with write_transaction(self._engine) as conn:
            erase_freed_content(conn)
            sign_ins = _delete_where(conn, tables.oauth_sign_ins, tenant)
            grants = _delete_where(conn, tables.oauth_grants, tenant)
            tools, versions = tables.catalog_tools, tables.catalog_versions
            conn.execute(delete(tools).where(tools.c.tenant == tenant))
            conn.execute(delete(versions).where(versions.c.tenant == tenant))
            connections = _delete_where(conn, tables.connections, tenant)
        # The sealed secrets' pages as they were are gone from SQLite's write-ahead log too.
        settle_freed_content(self._engine)
        return TenantSettingsDeleted(connections, grants, sign_ins)


def _delete_run(conn: Connection, run_id: str) -> DeletedRun | None:
    runs = tables.runs
    # The Run's row first, locked: appends to it wait for this transaction, then find no Run.
    row = conn.execute(
        select(runs.c.tenant, runs.c.last_sequence).where(runs.c.run_id == run_id).with_for_update()
    ).first()
    if row is None:
        return None
    erase_freed_content(conn)
    for table in RUN_TABLES:
        conn.execute(delete(table).where(table.c.run_id == run_id))
    conn.execute(delete(runs).where(runs.c.run_id == run_id))
    return DeletedRun(run_id, str(row.tenant), int(row.last_sequence))


def _delete_where(conn: Connection, table: Table, tenant: str) -> int:
    return conn.execute(delete(table).where(table.c.tenant == tenant)).rowcount


def database_bytes(engine: Engine) -> int:
    """The database's size: SQLite's file (pages in use and free), PostgreSQL's database."""
    with read_transaction(engine) as conn:
        if conn.dialect.name == "sqlite":
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
            size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
            return int(pages) * int(size)
        size_query = select(func.pg_database_size(func.current_database()))
        return int(conn.execute(size_query).scalar_one())


def reclaim_space(engine: Engine) -> None:
    """Give the space of deleted rows back. SQLite: VACUUM rewrites the file without its free
    pages (it waits for, and then holds, the write lock for as long as a copy of the database
    takes), after a truncating checkpoint of the write-ahead log. PostgreSQL: VACUUM of the
    Run tables marks the deleted row versions' space free for reuse and hands trailing empty
    pages back; the files shrink no further (VACUUM FULL would, under an exclusive lock)."""
    if engine.dialect.name == "sqlite":
        settle_freed_content(engine)
        # On the DB-API connection, outside any transaction: VACUUM cannot run in one.
        dbapi_connection = engine.raw_connection()
        try:
            dbapi_connection.cursor().execute("VACUUM")
        finally:
            dbapi_connection.close()
        settle_freed_content(engine)
        return
    with engine.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        for table in (*RUN_TABLES, tables.runs):
            connection.exec_driver_sql(f"VACUUM (ANALYZE) {table.name}")

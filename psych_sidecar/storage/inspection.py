"""Reads across Runs for the Run inspector (the domain's RunDirectory): metadata only."""

from __future__ import annotations

from sqlalchemy import Engine, and_, func, select

from psych_sidecar.domain.inspect import RecordSummary, RunSummary
from psych_sidecar.domain.runlog import RecordKind
from psych_sidecar.storage import tables
from psych_sidecar.storage.db import transaction


class SqlRunDirectory:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def list_runs(self, tenant: str, limit: int) -> list[RunSummary]:
        runs, records = tables.runs, tables.records
        # The last record's time is the Run's last activity: one primary-key lookup per Run.
        query = (
            select(
                runs.c.run_id,
                runs.c.tenant,
                runs.c.spec_name,
                runs.c.spec_version,
                runs.c.create_time_us,
                runs.c.last_sequence,
                func.coalesce(records.c.create_time_us, runs.c.create_time_us),
            )
            .select_from(
                runs.outerjoin(
                    records,
                    and_(
                        records.c.run_id == runs.c.run_id,
                        records.c.sequence == runs.c.last_sequence,
                    ),
                )
            )
            .order_by(runs.c.create_time_us.desc(), runs.c.run_id)
            .limit(limit)
        )
        if tenant:
            query = query.where(runs.c.tenant == tenant)
        with transaction(self._engine, write=False) as conn:
            rows = conn.execute(query).all()
        return [
            RunSummary(
                run_id,
                run_tenant,
                spec_name,
                int(spec_version),
                tables.from_us(created),
                int(last_sequence),
                tables.from_us(int(last_activity)),
            )
            for (
                run_id,
                run_tenant,
                spec_name,
                spec_version,
                created,
                last_sequence,
                last_activity,
            ) in rows
        ]

    def tenants(self, limit: int) -> list[str]:
        runs = tables.runs
        query = select(runs.c.tenant).distinct().order_by(runs.c.tenant).limit(limit)
        with transaction(self._engine, write=False) as conn:
            return [str(tenant) for (tenant,) in conn.execute(query)]

    def record_summaries(self, run_id: str) -> list[RecordSummary]:
        r = tables.records
        query = (
            select(
                r.c.sequence,
                r.c.kind,
                r.c.server,
                r.c.tool,
                r.c.call_id,
                r.c.is_error,
                r.c.content_bytes,
                r.c.handle,
                r.c.create_time_us,
            )
            .where(r.c.run_id == run_id)
            .order_by(r.c.sequence)
        )
        with transaction(self._engine, write=False) as conn:
            rows = conn.execute(query).all()
        return [
            RecordSummary(
                int(sequence),
                RecordKind(kind),
                server,
                tool,
                call_id,
                bool(is_error),
                int(content_bytes),
                handle or "",
                tables.from_us(created),
            )
            for (
                sequence,
                kind,
                server,
                tool,
                call_id,
                is_error,
                content_bytes,
                handle,
                created,
            ) in rows
        ]

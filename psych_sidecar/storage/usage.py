"""Provider-reported usage events (the `usage_events` table) and a Run's totals."""

from __future__ import annotations

from dataclasses import fields

from sqlalchemy import Connection, Engine, func, insert, select
from sqlalchemy.exc import IntegrityError

from psych_sidecar.domain.errors import RequestIdReused
from psych_sidecar.domain.usage import ModelCallUsage, UsageEvent, UsageTotals
from psych_sidecar.storage import tables
from psych_sidecar.storage.transactions import newest_of_run, read_transaction, write_transaction
from psych_sidecar.telemetry import metrics

# usage_events stores a model call's usage in columns named after ModelCallUsage's fields, and
# a Run's totals are UsageTotals' fields: the count of calls, then the sum of each token count.
_USAGE_COLUMNS = tuple(field.name for field in fields(ModelCallUsage))
_TOKEN_COLUMNS = tuple(field.name for field in fields(UsageTotals))[1:]


class SqlUsageStore:
    """Implements the domain's UsageRepository. Events are only ever inserted."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def record_usage(
        self, run_id: str, event_id: str, usage: ModelCallUsage, fingerprint: str
    ) -> UsageTotals:
        events = tables.usage_events
        try:
            with write_transaction(self._engine) as conn:
                inserted = not self._already_recorded(conn, run_id, event_id, fingerprint)
                if inserted:
                    # Checked before storing: a Run whose totals overflowed int64 could never
                    # answer RecordUsage or GetRunUsage again.
                    totals = self._totals(conn, run_id).plus(usage)
                    conn.execute(
                        insert(events).values(
                            run_id=run_id,
                            event_id=event_id,
                            fingerprint=fingerprint,
                            **tables.same_named(usage, _USAGE_COLUMNS),
                            create_time_us=tables.now_us(),
                        )
                    )
                else:
                    totals = self._totals(conn, run_id)
            if inserted:
                # Counted once the event is stored: a retry of it adds nothing.
                metrics.record_usage(
                    usage.input_tokens,
                    usage.cache_read_tokens,
                    usage.cache_write_tokens,
                    usage.output_tokens,
                )
            return totals
        except IntegrityError:
            # A concurrent retry of the same event won the insert; compare with what it stored.
            with read_transaction(self._engine) as conn:
                self._already_recorded(conn, run_id, event_id, fingerprint)
                return self._totals(conn, run_id)

    @staticmethod
    def _already_recorded(conn: Connection, run_id: str, event_id: str, fingerprint: str) -> bool:
        events = tables.usage_events
        stored = conn.execute(
            select(events.c.fingerprint).where(
                events.c.run_id == run_id, events.c.event_id == event_id
            )
        ).scalar()
        if stored is None:
            return False
        if stored != fingerprint:
            raise RequestIdReused(
                f"request id {event_id!r} was already used in this run for different usage",
                run_id=run_id,
                request_id=event_id,
            )
        return True

    def usage_totals(self, run_id: str) -> UsageTotals:
        with read_transaction(self._engine) as conn:
            return self._totals(conn, run_id)

    def usage_events(self, run_id: str, limit: int) -> list[UsageEvent]:
        return [
            UsageEvent(
                row.event_id,
                ModelCallUsage(**tables.same_named(row, _USAGE_COLUMNS)),
                tables.from_us(row.create_time_us),
            )
            for row in newest_of_run(self._engine, tables.usage_events, "event_id", run_id, limit)
        ]

    @staticmethod
    def _totals(conn: Connection, run_id: str) -> UsageTotals:
        events = tables.usage_events
        row = conn.execute(
            select(
                func.count(),
                *(func.coalesce(func.sum(events.c[name]), 0) for name in _TOKEN_COLUMNS),
            ).where(events.c.run_id == run_id)
        ).one()
        return UsageTotals(*(int(value) for value in row))

"""What a PostgreSQL-backed case costs the database, read from the server itself: statements
(pg_stat_statements when the cluster preloads it, as scripts/with-postgres does), queries and
transactions as PgBouncer counts them (SHOW STATS), WAL bytes (pg_current_wal_lsn), the
database's size (pg_database_size), server connections and lock waits (pg_stat_activity,
sampled), PgBouncer's pools (SHOW POOLS), and the CPU seconds of every process involved
(/proc). Not pg_stat_database or pg_stat_wal: a backend reports to them at most once a second,
or 10 s after it went idle, so a delta over a few seconds misses part of the work."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine, make_url, text

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def libpq_url(sqlalchemy_url: str) -> str:
    """postgresql+psycopg://… as libpq's postgresql://…"""
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(False)


@dataclass
class Snapshot:
    """Cumulative counters of one database at one moment."""

    wal_lsn: int
    database_bytes: int
    # calls by normalized statement text (pg_stat_statements), when available.
    statements: dict[str, int] | None
    # PgBouncer's cumulative query and transaction counts for the database, when readable.
    bouncer_queries: int | None
    bouncer_transactions: int | None


@dataclass
class Delta:
    wal_bytes: int
    database_bytes: int
    statements: int | None
    statements_by_text: dict[str, int] | None
    bouncer_queries: int | None
    bouncer_transactions: int | None

    def per(self, count: int) -> dict[str, Any]:
        """The figures per operation (`count` of them)."""
        figures: dict[str, Any] = {
            "wal_bytes": round(self.wal_bytes / count, 1),
            "database_growth_bytes": round(self.database_bytes / count, 1),
        }
        if self.statements is not None:
            figures["statements"] = round(self.statements / count, 2)
        if self.bouncer_queries is not None:
            figures["pgbouncer_queries"] = round(self.bouncer_queries / count, 2)
        if self.bouncer_transactions is not None:
            figures["pgbouncer_transactions"] = round(self.bouncer_transactions / count, 2)
        return figures

    def top_statements(self, count: int, limit: int = 12) -> dict[str, float]:
        """The statements run most often, per operation, the text cut to 90 characters."""
        if not self.statements_by_text:
            return {}
        ordered = sorted(self.statements_by_text.items(), key=lambda item: -item[1])
        return {
            " ".join(query.split())[:90]: round(calls / count, 2)
            for query, calls in ordered[:limit]
            if calls
        }


class DatabaseCounters:
    """Counters of the database `name` on the cluster at `admin_url` (a superuser's direct
    address of another database, so that reading them adds nothing to `name`'s), and
    PgBouncer's for it at `bouncer_url` (any address of that PgBouncer)."""

    def __init__(self, admin_url: str, name: str, bouncer_url: str | None) -> None:
        self.name = name
        self._engine: Engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self._bouncer = None if bouncer_url is None else _admin_console(bouncer_url)
        self._console: psycopg.Connection[Any] | None = None
        self.statements_available = self._enable_statements()

    def close(self) -> None:
        self._engine.dispose()
        if self._console is not None:
            self._console.close()

    def _enable_statements(self) -> bool:
        try:
            with self._engine.connect() as connection:
                connection.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
                connection.execute(text("SELECT count(*) FROM pg_stat_statements"))
        except Exception:  # not preloaded: the view refuses to answer
            return False
        return True

    def snapshot(self) -> Snapshot:
        with self._engine.connect() as connection:
            lsn, size = connection.execute(
                text(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, "
                    "pg_database_size(:name)"
                ),
                {"name": self.name},
            ).one()
            statements = None
            if self.statements_available:
                statements = {
                    row.query: int(row.calls)
                    for row in connection.execute(
                        text(
                            "SELECT query, sum(calls) AS calls FROM pg_stat_statements "
                            "JOIN pg_database d ON d.oid = dbid WHERE d.datname = :name "
                            "GROUP BY query"
                        ),
                        {"name": self.name},
                    )
                }
        queries, transactions = self._bouncer_stats()
        return Snapshot(
            wal_lsn=int(lsn),
            database_bytes=int(size),
            statements=statements,
            bouncer_queries=queries,
            bouncer_transactions=transactions,
        )

    def _bouncer_stats(self) -> tuple[int | None, int | None]:
        for row in self._bouncer_show("STATS"):
            if row.get("database") == self.name:
                return int(row["total_query_count"]), int(row["total_xact_count"])
        return None, None

    def bouncer_pools(self) -> dict[str, int] | None:
        """SHOW POOLS for the database: client and server connections by state."""
        for row in self._bouncer_show("POOLS"):
            if row.get("database") == self.name:
                keys = ("cl_active", "cl_waiting", "sv_active", "sv_idle", "sv_used")
                return {key: int(row[key]) for key in keys if key in row}
        return None

    def _bouncer_show(self, what: str) -> list[dict[str, Any]]:
        if self._bouncer is None:
            return []
        try:
            if self._console is None or self._console.closed:
                # The admin console takes no transactions.
                self._console = psycopg.connect(self._bouncer, autocommit=True, connect_timeout=5)
            # Without parameters psycopg uses the simple query protocol, all the console speaks.
            cursor = self._console.execute(f"SHOW {what}", prepare=False)
            names = [column.name for column in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        except psycopg.Error:
            return []

    def activity(self) -> tuple[int, int, int]:
        """Server connections to the database now: all, active ones, ones waiting for a lock."""
        with self._engine.connect() as connection:
            row = connection.execute(
                text(
                    "SELECT count(*) AS held, "
                    "count(*) FILTER (WHERE state <> 'idle') AS active, "
                    "count(*) FILTER (WHERE wait_event_type = 'Lock') AS waiting "
                    "FROM pg_stat_activity WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": self.name},
            ).one()
        return int(row.held), int(row.active), int(row.waiting)


def delta(before: Snapshot, after: Snapshot) -> Delta:
    by_text = None
    if before.statements is not None and after.statements is not None:
        by_text = {
            query: calls - before.statements.get(query, 0)
            for query, calls in after.statements.items()
        }

    def diff(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else b - a

    return Delta(
        wal_bytes=after.wal_lsn - before.wal_lsn,
        database_bytes=after.database_bytes - before.database_bytes,
        statements=None if by_text is None else sum(by_text.values()),
        statements_by_text=by_text,
        bouncer_queries=diff(before.bouncer_queries, after.bouncer_queries),
        bouncer_transactions=diff(before.bouncer_transactions, after.bouncer_transactions),
    )


def _admin_console(bouncer_url: str) -> str:
    """The libpq address of PgBouncer's admin console (its database `pgbouncer`)."""
    return make_url(libpq_url(bouncer_url)).set(database="pgbouncer").render_as_string(False)


@dataclass
class ActivitySamples:
    """pg_stat_activity (and SHOW POOLS) sampled every `interval` seconds while a block runs."""

    held: list[int] = field(default_factory=list)
    active: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    pools: list[dict[str, int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        if not self.held:
            return {}
        figures: dict[str, Any] = {
            "server_connections_max": max(self.held),
            "server_connections_active_mean": round(sum(self.active) / len(self.active), 1),
            "lock_waiting_samples": sum(1 for w in self.waiting if w),
            "lock_waiting_max": max(self.waiting),
            "samples": len(self.held),
        }
        if self.pools:
            figures["pgbouncer_clients_max"] = max(
                p.get("cl_active", 0) + p.get("cl_waiting", 0) for p in self.pools
            )
            figures["pgbouncer_clients_waiting_max"] = max(
                p.get("cl_waiting", 0) for p in self.pools
            )
            figures["pgbouncer_servers_max"] = max(
                p.get("sv_active", 0) + p.get("sv_idle", 0) + p.get("sv_used", 0)
                for p in self.pools
            )
        return figures


@contextlib.contextmanager
def sampled(counters: DatabaseCounters, interval: float = 0.1) -> Iterator[ActivitySamples]:
    """Sample the database's connections in a thread of its own until the block ends."""
    samples = ActivitySamples()
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval):
            held, active, waiting = counters.activity()
            samples.held.append(held)
            samples.active.append(active)
            samples.waiting.append(waiting)
            pools = counters.bouncer_pools()
            if pools is not None:
                samples.pools.append(pools)

    thread = threading.Thread(target=sample, name="pg-activity", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(10)


# --- CPU seconds from /proc ----------------------------------------------------------------


def process_cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU seconds of a process (and of its waited-for children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / CLOCK_TICKS


def _children(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == parent:
                pids.append(int(entry))
    return pids


def postgres_cpu_seconds(data_dir: str | None) -> float | None:
    """CPU seconds of the cluster: the postmaster, the processes it runs now and those it
    has reaped."""
    if not data_dir:
        return None
    try:
        postmaster = int(Path(data_dir, "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return process_cpu_seconds(postmaster, children=True) + sum(
        process_cpu_seconds(pid) for pid in _children(postmaster)
    )


def pgbouncer_pid(bouncer_url: str | None) -> int | None:
    """The PgBouncer listening on the URL's port (its ini file names the port)."""
    if not bouncer_url:
        return None
    port = make_url(bouncer_url).port
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() != "pgbouncer":
                continue
            ini = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[-2].decode()
            if f"listen_port = {port}\n" in Path(ini).read_text():
                return int(entry)
        except (OSError, IndexError, UnicodeDecodeError):
            continue
    return None


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent not idle, since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


class CpuMeter:
    """CPU seconds spent by each named group of processes between `start` and `stop`."""

    def __init__(self, groups: dict[str, Any]) -> None:
        # name -> a function answering that group's cumulative CPU seconds
        self._groups = groups
        self._start: dict[str, float] = {}
        self._wall = 0.0

    def _read(self) -> dict[str, float]:
        values = {name: float(read() or 0.0) for name, read in self._groups.items()}
        values["machine"] = machine_busy_seconds()
        return values

    def start(self) -> None:
        self._start = self._read()
        self._wall = time.monotonic()

    def stop(self, per: int) -> dict[str, Any]:
        """CPU milliseconds per operation (`per` of them) by group, the rest of the machine's
        busy time as `other`, and the cores busy on average."""
        end = self._read()
        wall = time.monotonic() - self._wall
        spent = {name: end[name] - self._start[name] for name in end}
        known = sum(value for name, value in spent.items() if name != "machine")
        spent["other"] = max(0.0, spent["machine"] - known)
        figures: dict[str, Any] = {
            f"{name}_cpu_ms": round(value * 1000 / per, 3) for name, value in spent.items()
        }
        figures["cores_busy"] = round(spent["machine"] / wall, 2) if wall else None
        return figures

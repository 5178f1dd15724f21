"""The database source of `psych-sidecar inspect --database-url`: the same reads as the gRPC
source, made by the services the servicers use (RunService, ConnectionService, TurnResolver
and PromptAssembler as a preview), built by the composition root over storage opened
read-only (``app.graph.open_database_reader``: never a write, never a migration, a known
schema revision only).

No MCP session runs here: connection states are the stored ones (STORED, since the
connection was last put), and a prompt's server states are those pinned with the turn's
surface (:class:`PinnedStates`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from psych_sidecar.app.graph import open_database_reader
from psych_sidecar.domain.catalog import TransportKind
from psych_sidecar.domain.errors import SidecarError
from psych_sidecar.domain.prompt import PromptCall, ToolResultView
from psych_sidecar.domain.run_inspector import compaction_views
from psych_sidecar.inspect_command.views import (
    ChangeRow,
    CompactionRow,
    ConnectionRow,
    PromptPreview,
    RecordRow,
    Refused,
    RunRow,
    VersionRow,
    ZoneRow,
    change_rows,
    paged,
)

T = TypeVar("T")


class DatabaseSource:
    live = False

    def __init__(self, database_url: str, timeout: float) -> None:
        """Raises DatabaseRefused (no such SQLite file, an unknown schema revision)."""
        self._reader = open_database_reader(database_url, timeout)
        self.where = self._reader.engine.url.render_as_string(hide_password=True)
        services = self._reader.services
        self._runs = services.runs
        self._log = services.log
        self._connections = services.connections
        self._assembler = services.assembler

    def close(self) -> None:
        self._reader.close()

    def _read(self, function: Callable[..., T], *args: Any) -> T:
        try:
            return function(*args)
        except SidecarError as error:
            raise Refused(f"{error.reason}: {error.message}") from error

    def _await(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """One of ConnectionService's async use cases, run to its end here."""

        async def run() -> T:
            return await function(*args)

        try:
            return asyncio.run(run())
        except SidecarError as error:
            raise Refused(f"{error.reason}: {error.message}") from error

    def runs(self, tenant: str, limit: int) -> tuple[list[RunRow], bool]:
        rows: list[RunRow] = []
        token = ""
        while len(rows) < limit:
            page, token = self._read(
                self._runs.list_runs, tenant, min(limit - len(rows), 1000), token
            )
            rows.extend(
                RunRow(r.run.run_id, r.run.spec_name, r.run.spec_version, r.run.create_time)
                for r in page
            )
            if not token:
                break
        return rows, bool(token)

    def records(self, run_id: str) -> list[RecordRow]:
        self._read(self._runs.get, run_id)
        return [
            RecordRow(
                r.sequence,
                r.kind.name,
                r.call_id,
                r.server,
                r.tool,
                r.is_error,
                r.content_bytes,
                r.handle,
            )
            for r in self._read(self._log.record_skeletons, run_id)
        ]

    def compactions(self, run_id: str) -> list[CompactionRow]:
        return [
            CompactionRow(
                c.sequence, c.create_time, c.first_sequence, c.last_sequence, c.summary_chars
            )
            for c in self._read(compaction_views, self._runs, self._log, run_id)
        ]

    def prompt(self, run_id: str, now: datetime | None) -> PromptPreview:
        # AssemblePrompt's defaults (no tail, note, model, max_tokens or budget), as a preview.
        assembled = self._read(
            self._assembler.preview, PromptCall(run_id=run_id, now=now or datetime.now(UTC))
        )
        elided = frozenset(
            part.handle
            for message in assembled.prompt.history
            for part in message.parts
            if isinstance(part, ToolResultView) and part.elided
        )
        zones = tuple(
            ZoneRow(zone.zone.name.lower(), zone.byte_length, zone.sha256)
            for zone in assembled.zones
        )
        return PromptPreview(
            zones,
            elided,
            assembled.anthropic_json,
            assembled.openai_json,
            assembled.openai_responses_json,
            assembled.gemini_json,
        )

    def catalog_versions(self, tenant: str, name: str) -> list[VersionRow]:
        return [
            VersionRow(v.catalog_version, v.tool_count, v.sha256, v.create_time)
            for v in paged(partial(self._await, self._connections.list_versions, tenant, name, 0))
        ]

    def catalog_diff(self, tenant: str, name: str, older: int, newer: int) -> list[ChangeRow]:
        diff = self._await(self._connections.diff, tenant, name, older, newer)
        return change_rows(diff)

    def connections(self, tenant: str) -> list[ConnectionRow]:
        return [
            ConnectionRow(
                connection.name,
                "stdio" if connection.transport is TransportKind.STDIO else "http",
                "STORED",
                status.state_time,
                status.catalog_version,
                "",
            )
            for connection, status in paged(
                partial(self._await, self._connections.list_connections, tenant, 0)
            )
        ]

"""The views of `psych-sidecar inspect`, one representation for both sources.

A source (:mod:`.remote`: a running sidecar over gRPC; :mod:`.database`: the database, read
only) answers in the rows below; each view builds its JSON document from them and the same
data as a table. Nothing here knows gRPC or SQL.
"""

from __future__ import annotations

import argparse
import hashlib
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

Data = dict[str, Any]
T = TypeVar("T")


class Refused(Exception):
    """The source refused a read (an unknown Run, a bad name, an unreachable sidecar): the
    message is one line, printed after the source's name."""


@dataclass(frozen=True, slots=True)
class RunRow:
    run_id: str
    spec_name: str
    spec_version: int
    create_time: datetime


@dataclass(frozen=True, slots=True)
class RecordRow:
    """A record's metadata; `bytes` counts its content as the log stores it (UTF-8 text,
    JSON bytes, binary data)."""

    sequence: int
    kind: str  # USER_MESSAGE, ASSISTANT_MESSAGE, TOOL_RESULT or COMPACTION
    call_id: str
    server: str
    tool: str
    is_error: bool
    bytes: int
    handle: str


@dataclass(frozen=True, slots=True)
class CompactionRow:
    """A compaction record: the records its summary stands for, the summary's size in
    characters, and when the host appended it."""

    sequence: int
    create_time: datetime
    first_sequence: int
    last_sequence: int
    summary_chars: int


@dataclass(frozen=True, slots=True)
class ZoneRow:
    zone: str  # static_system, dynamic_tail, history, transient
    bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class PromptPreview:
    """A Run's prompt as the next call would get it (assembled as a preview)."""

    zones: tuple[ZoneRow, ...]
    # Handles of the tool results the prompt shows elided.
    elided_handles: frozenset[str]
    anthropic_json: bytes
    openai_json: bytes
    openai_responses_json: bytes
    gemini_json: bytes


@dataclass(frozen=True, slots=True)
class VersionRow:
    version: int
    tools: int
    sha256: str
    create_time: datetime


@dataclass(frozen=True, slots=True)
class ChangeRow:
    change: str  # added, changed, removed
    tool: str
    version: int


def change_rows(diff: Any) -> list[ChangeRow]:
    """The rows of a catalogue diff, from either source: anything with `added`, `changed`
    and `removed` lists of tools that have a `name` and a `catalog_version`."""
    return [
        ChangeRow(change, tool.name, tool.catalog_version)
        for change, tools in (
            ("added", diff.added),
            ("changed", diff.changed),
            ("removed", diff.removed),
        )
        for tool in tools
    ]


def paged(read_page: Callable[[str], tuple[Sequence[T], str]]) -> Iterator[T]:
    """Every item of a listing read a page at a time, by either source: `read_page(token)`
    answers a page and the next one's token, empty after the last."""
    token = ""
    while True:
        page, token = read_page(token)
        yield from page
        if not token:
            return


@dataclass(frozen=True, slots=True)
class ConnectionRow:
    name: str
    transport: str  # stdio or http
    # A live state (CONNECTING, CONNECTED, UNREACHABLE, AUTHORIZATION_REQUIRED), or STORED
    # from the database.
    state: str
    since: datetime | None
    catalog_version: int
    last_error: str


class Source(Protocol):
    """Where the views read from. Every method only reads; each raises :class:`Refused`."""

    # How errors name the source: the gRPC target, or the database URL without password.
    where: str
    # Whether connection states are live (a running sidecar's sessions) or as stored.
    live: bool

    def runs(self, tenant: str, limit: int) -> tuple[list[RunRow], bool]:
        """At most `limit` of the tenant's Runs, newest first, and whether more exist."""
        ...

    def records(self, run_id: str) -> list[RecordRow]: ...

    def compactions(self, run_id: str) -> list[CompactionRow]:
        """The Run's compaction records, in sequence order."""
        ...

    def prompt(self, run_id: str, now: datetime | None) -> PromptPreview:
        """The prompt assembled as a preview (no journal row) at `now` (None: the clock)."""
        ...

    def catalog_versions(self, tenant: str, name: str) -> list[VersionRow]:
        """Newest first."""
        ...

    def catalog_diff(self, tenant: str, name: str, older: int, newer: int) -> list[ChangeRow]: ...

    def connections(self, tenant: str) -> list[ConnectionRow]: ...


def render(source: Source, arguments: argparse.Namespace) -> tuple[Data, str]:
    """The view `arguments.view` read from `source`: its JSON document and its table."""
    views: dict[str, Callable[[Source, argparse.Namespace], tuple[Data, str]]] = {
        "runs": _runs,
        "log": _log,
        "prompt": _prompt,
        "catalog": _catalog,
        "connections": _connections,
    }
    return views[arguments.view](source, arguments)


def timestamp(value: datetime) -> str:
    """RFC 3339 in UTC as protobuf's JSON writes a Timestamp: 0, 3 or 6 fraction digits."""
    value = value.astimezone(UTC)
    micros = value.microsecond
    fraction = (
        "" if micros == 0 else f".{micros // 1000:03d}" if micros % 1000 == 0 else f".{micros:06d}"
    )
    return value.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "Z"


def _runs(source: Source, arguments: argparse.Namespace) -> tuple[Data, str]:
    runs, more = source.runs(arguments.tenant, arguments.limit)
    rows = [
        {
            "run_id": r.run_id,
            "spec": f"{r.spec_name}@{r.spec_version}",
            "created": timestamp(r.create_time),
        }
        for r in runs
    ]
    data = {"tenant": arguments.tenant, "runs": rows, "more": more}
    table = _table(["run_id", "spec", "created"], rows)
    if more:
        table += f"(more than {arguments.limit}; use --limit)\n"
    return data, table


def _log(source: Source, arguments: argparse.Namespace) -> tuple[Data, str]:
    records = source.records(arguments.run_id)
    elided = source.prompt(arguments.run_id, arguments.now).elided_handles
    kinds = Counter(record.kind for record in records)
    results = [
        {
            "sequence": record.sequence,
            "call_id": record.call_id,
            "server": record.server,
            "tool": record.tool,
            "is_error": record.is_error,
            "bytes": record.bytes,
            "handle": record.handle,
            "elided_now": record.handle in elided,
        }
        for record in records
        if record.kind == "TOOL_RESULT"
    ]
    # Turn 1 is the first user message's; a compaction covers the turns that start in its
    # range (it may open on the previous compaction record, inside that one's last turn).
    starts = [record.sequence for record in records if record.kind == "USER_MESSAGE"]
    compactions = [
        {
            "sequence": c.sequence,
            "created": timestamp(c.create_time),
            "records": f"{c.first_sequence}-{c.last_sequence}",
            "turns": f"{bisect_left(starts, c.first_sequence) + 1}-"
            f"{bisect_right(starts, c.last_sequence)}",
            "summary_chars": c.summary_chars,
        }
        for c in source.compactions(arguments.run_id)
    ]
    data = {
        "run_id": arguments.run_id,
        "records": len(records),
        "records_by_kind": dict(sorted(kinds.items())),
        "tool_results": results,
        "elided_now": sum(1 for r in results if r["elided_now"]),
        "compactions": compactions,
    }
    table = _table(
        ["kind", "records"], [{"kind": k, "records": n} for k, n in sorted(kinds.items())]
    )
    table += "\n" + _table(
        ["sequence", "call_id", "server", "tool", "is_error", "bytes", "handle", "elided_now"],
        results,
    )
    if compactions:
        table += "\n" + _table(
            ["sequence", "created", "records", "turns", "summary_chars"], compactions
        )
    return data, table


def _prompt(source: Source, arguments: argparse.Namespace) -> tuple[Data, str]:
    prompt = source.prompt(arguments.run_id, arguments.now)
    zones = [
        {
            "zone": zone.zone,
            "bytes": zone.bytes,
            # The sidecar's estimate: ceil(bytes / 4).
            "estimated_tokens": -(-zone.bytes // 4),
            "sha256": zone.sha256,
        }
        for zone in prompt.zones
    ]
    bodies = {
        "anthropic": prompt.anthropic_json,
        "openai": prompt.openai_json,
        "openai_responses": prompt.openai_responses_json,
        "gemini": prompt.gemini_json,
    }
    data = {
        "run_id": arguments.run_id,
        "zones": zones,
        "requests": {
            name: {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
            for name, body in bodies.items()
        },
    }
    table = _table(["zone", "bytes", "estimated_tokens", "sha256"], zones)
    table += "\n" + _table(
        ["request", "bytes", "sha256"],
        [{"request": name, **value} for name, value in data["requests"].items()],
    )
    return data, table


def _catalog(source: Source, arguments: argparse.Namespace) -> tuple[Data, str]:
    if arguments.diff:
        from_version, to_version = arguments.diff
        changes = [
            {"change": c.change, "tool": c.tool, "version": c.version}
            for c in source.catalog_diff(arguments.tenant, arguments.name, from_version, to_version)
        ]
        data: Data = {
            "tenant": arguments.tenant,
            "name": arguments.name,
            "from_version": from_version,
            "to_version": to_version,
            "changes": changes,
        }
        return data, _table(["change", "tool", "version"], changes)
    rows = [
        {
            "version": v.version,
            "tools": v.tools,
            "sha256": v.sha256,
            "created": timestamp(v.create_time),
        }
        for v in source.catalog_versions(arguments.tenant, arguments.name)
    ]
    data = {"tenant": arguments.tenant, "name": arguments.name, "versions": rows}
    return data, _table(["version", "tools", "sha256", "created"], rows)


def _connections(source: Source, arguments: argparse.Namespace) -> tuple[Data, str]:
    rows = [
        {
            "name": c.name,
            "transport": c.transport,
            "state": c.state,
            "since": timestamp(c.since) if c.since is not None else "",
            "catalog_version": c.catalog_version,
            "last_error": c.last_error,
        }
        for c in source.connections(arguments.tenant)
    ]
    data = {"tenant": arguments.tenant, "live": source.live, "connections": rows}
    table = _table(["name", "transport", "state", "since", "catalog_version", "last_error"], rows)
    if not source.live:
        table += (
            "(stored in the database, not live: no MCP session runs here; `since` is when the "
            "connection was last put; a running sidecar reports live states)\n"
        )
    return data, table


def _table(columns: Sequence[str], rows: Sequence[Data]) -> str:
    """Left-aligned columns under a header; "(none)" for no rows."""
    if not rows:
        return " ".join(columns) + "\n(none)\n"
    cells = [[_cell(row[column]) for column in columns] for row in rows]
    widths = [
        max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)
    ]
    lines = [columns, *cells]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in lines
    )


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)

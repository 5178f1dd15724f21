"""`psych-sidecar inspect`: a read-only operator's view of a running sidecar, over gRPC.

Every subcommand makes read calls only (ListRuns, ListRecords, ListConnections,
ListCatalogVersions, DiffCatalog, and AssemblePrompt as a preview: no journal row, no prompt
metrics) and prints a table, or with --json one JSON document built from the same data.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import grpc

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    connection_service_pb2_grpc,
    content_pb2,
    run_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
    turn_pb2,
    turn_service_pb2,
    turn_service_pb2_grpc,
)

# Responses may be as large as the sidecar's own limit allows.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]
_KINDS = {
    "user_message": "USER_MESSAGE",
    "assistant_message": "ASSISTANT_MESSAGE",
    "tool_result": "TOOL_RESULT",
}

Data = dict[str, Any]


def add_parser(commands: Any) -> None:
    """The `inspect` subcommand and its own subcommands, on the CLI's subparsers."""
    inspect = commands.add_parser(
        "inspect", help="read-only views of a running sidecar (Runs, prompts, connections)"
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--address",
        default=None,
        help="unix:///path or HOST:PORT (default: the first listen address of the settings)",
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument("--timeout", type=float, default=30.0, help="seconds per call")
    views = inspect.add_subparsers(dest="view", required=True)
    runs = views.add_parser("runs", parents=[common], help="a tenant's Runs, newest first")
    runs.add_argument("tenant")
    runs.add_argument("--limit", type=int, default=50, help="at most this many Runs")
    log = views.add_parser(
        "log", parents=[common], help="a Run's log: records by kind, tool results, what is elided"
    )
    log.add_argument("run_id")
    prompt = views.add_parser(
        "prompt", parents=[common], help="a Run's prompt now, by zone, with sizes and hashes"
    )
    prompt.add_argument("run_id")
    catalog = views.add_parser(
        "catalog", parents=[common], help="a connection's catalogue versions, or a diff of two"
    )
    catalog.add_argument("tenant")
    catalog.add_argument("name")
    catalog.add_argument(
        "--diff",
        nargs=2,
        type=int,
        metavar=("FROM", "TO"),
        help="the tools added, changed and removed between two versions (TO 0: the current)",
    )
    connections = views.add_parser(
        "connections", parents=[common], help="a tenant's MCP connections and their states"
    )
    connections.add_argument("tenant")


def run(arguments: argparse.Namespace, target: str, out: TextIO | None = None) -> int:
    """Run one inspect subcommand against `target`; 0, or 1 when the sidecar refused."""
    views: dict[str, Callable[[grpc.Channel, argparse.Namespace], tuple[Data, str]]] = {
        "runs": _runs,
        "log": _log,
        "prompt": _prompt,
        "catalog": _catalog,
        "connections": _connections,
    }
    with grpc.insecure_channel(target, options=_CHANNEL_OPTIONS) as channel:
        try:
            data, table = views[arguments.view](channel, arguments)
        except grpc.RpcError as error:
            print(f"{target}: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    out = out or sys.stdout
    out.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n" if arguments.json else table)
    return 0


# The views: each returns its data and the same data as a table.


def _runs(channel: grpc.Channel, arguments: argparse.Namespace) -> tuple[Data, str]:
    stub = run_service_pb2_grpc.RunServiceStub(channel)
    runs: list[run_pb2.Run] = []
    token = ""
    while len(runs) < arguments.limit:
        request = run_service_pb2.ListRunsRequest(
            tenant=arguments.tenant,
            page_size=min(arguments.limit - len(runs), 1000),
            page_token=token,
        )
        response = stub.ListRuns(request, timeout=arguments.timeout)
        runs.extend(response.runs)
        token = response.next_page_token
        if not token:
            break
    rows = [
        {
            "run_id": r.run_id,
            "spec": f"{r.spec_name}@{r.spec_version}",
            "created": r.create_time.ToJsonString(),
        }
        for r in runs
    ]
    data = {"tenant": arguments.tenant, "runs": rows, "more": bool(token)}
    table = _table(["run_id", "spec", "created"], rows)
    if token:
        table += f"(more than {arguments.limit}; use --limit)\n"
    return data, table


def _records(
    stub: run_service_pb2_grpc.RunServiceStub, run_id: str, timeout: float
) -> Iterator[run_pb2.Record]:
    token = ""
    while True:
        response = stub.ListRecords(
            run_service_pb2.ListRecordsRequest(run_id=run_id, page_token=token), timeout=timeout
        )
        yield from response.records
        token = response.next_page_token
        if not token:
            return


def content_bytes(parts: Sequence[content_pb2.ContentPart]) -> int:
    """Bytes of content as the log stores it: UTF-8 text, JSON bytes, binary data."""
    total = 0
    for part in parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            total += len(part.text.encode())
        elif kind == "json":
            total += len(part.json)
        elif kind == "binary":
            total += len(part.binary.data)
    return total


def _log(channel: grpc.Channel, arguments: argparse.Namespace) -> tuple[Data, str]:
    runs = run_service_pb2_grpc.RunServiceStub(channel)
    records = list(_records(runs, arguments.run_id, arguments.timeout))
    prompt = turn_service_pb2_grpc.TurnServiceStub(channel).AssemblePrompt(
        turn_service_pb2.AssemblePromptRequest(run_id=arguments.run_id, preview=True),
        timeout=arguments.timeout,
    )
    elided = {
        part.tool_result.handle
        for message in prompt.prompt.history
        for part in message.parts
        if part.WhichOneof("kind") == "tool_result" and part.tool_result.elided
    }
    kinds = Counter(_KINDS[record.WhichOneof("kind") or ""] for record in records)
    results = [
        {
            "sequence": record.sequence,
            "call_id": record.tool_result.call_id,
            "server": record.tool_result.server,
            "tool": record.tool_result.tool,
            "is_error": record.tool_result.is_error,
            "bytes": content_bytes(record.tool_result.content),
            "handle": record.handle,
            "elided_now": record.handle in elided,
        }
        for record in records
        if record.WhichOneof("kind") == "tool_result"
    ]
    data = {
        "run_id": arguments.run_id,
        "records": len(records),
        "records_by_kind": dict(sorted(kinds.items())),
        "tool_results": results,
        "elided_now": sum(1 for r in results if r["elided_now"]),
    }
    table = _table(
        ["kind", "records"], [{"kind": k, "records": n} for k, n in sorted(kinds.items())]
    )
    table += "\n" + _table(
        ["sequence", "call_id", "server", "tool", "is_error", "bytes", "handle", "elided_now"],
        results,
    )
    return data, table


def _prompt(channel: grpc.Channel, arguments: argparse.Namespace) -> tuple[Data, str]:
    prompt = turn_service_pb2_grpc.TurnServiceStub(channel).AssemblePrompt(
        turn_service_pb2.AssemblePromptRequest(run_id=arguments.run_id, preview=True),
        timeout=arguments.timeout,
    )
    zones = [
        {
            "zone": turn_pb2.PromptZone.Name(zone.zone).removeprefix("PROMPT_ZONE_").lower(),
            "bytes": zone.byte_length,
            # The sidecar's estimate: ceil(bytes / 4).
            "estimated_tokens": -(-zone.byte_length // 4),
            "sha256": zone.sha256,
        }
        for zone in prompt.zones
    ]
    bodies = {
        "anthropic": prompt.anthropic_request_json,
        "openai": prompt.openai_request_json,
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


def _catalog(channel: grpc.Channel, arguments: argparse.Namespace) -> tuple[Data, str]:
    stub = connection_service_pb2_grpc.ConnectionServiceStub(channel)
    if arguments.diff:
        from_version, to_version = arguments.diff
        diff = stub.DiffCatalog(
            connection_service_pb2.DiffCatalogRequest(
                tenant=arguments.tenant,
                name=arguments.name,
                from_version=from_version,
                to_version=to_version,
            ),
            timeout=arguments.timeout,
        )
        changes = [
            {"change": change, "tool": tool.name, "version": tool.catalog_version}
            for change, tools in (
                ("added", diff.added),
                ("changed", diff.changed),
                ("removed", diff.removed),
            )
            for tool in tools
        ]
        data: Data = {
            "tenant": arguments.tenant,
            "name": arguments.name,
            "from_version": from_version,
            "to_version": to_version,
            "changes": changes,
        }
        return data, _table(["change", "tool", "version"], changes)
    versions: list[connection_pb2.CatalogVersion] = []
    token = ""
    while True:
        response = stub.ListCatalogVersions(
            connection_service_pb2.ListCatalogVersionsRequest(
                tenant=arguments.tenant, name=arguments.name, page_token=token
            ),
            timeout=arguments.timeout,
        )
        versions.extend(response.versions)
        token = response.next_page_token
        if not token:
            break
    rows = [
        {
            "version": v.catalog_version,
            "tools": v.tool_count,
            "sha256": v.sha256,
            "created": v.create_time.ToJsonString(),
        }
        for v in versions
    ]
    data = {"tenant": arguments.tenant, "name": arguments.name, "versions": rows}
    return data, _table(["version", "tools", "sha256", "created"], rows)


def _connections(channel: grpc.Channel, arguments: argparse.Namespace) -> tuple[Data, str]:
    stub = connection_service_pb2_grpc.ConnectionServiceStub(channel)
    connections: list[connection_pb2.Connection] = []
    token = ""
    while True:
        response = stub.ListConnections(
            connection_service_pb2.ListConnectionsRequest(
                tenant=arguments.tenant, page_token=token
            ),
            timeout=arguments.timeout,
        )
        connections.extend(response.connections)
        token = response.next_page_token
        if not token:
            break
    rows = [
        {
            "name": c.name,
            "transport": c.WhichOneof("transport") or "",
            "state": connection_pb2.ConnectionState.Name(c.state).removeprefix("CONNECTION_STATE_"),
            "since": c.state_time.ToJsonString() if c.HasField("state_time") else "",
            "catalog_version": c.catalog_version,
            "last_error": c.last_error,
        }
        for c in connections
    ]
    data = {"tenant": arguments.tenant, "connections": rows}
    return data, _table(
        ["name", "transport", "state", "since", "catalog_version", "last_error"], rows
    )


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

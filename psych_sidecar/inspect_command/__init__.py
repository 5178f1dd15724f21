"""`psych-sidecar inspect`: read-only operator views of a sidecar's Runs, prompts and
connections, from a running sidecar over gRPC (``--address``) or from its database
(``--database-url``).

Both sources answer in the same rows (:mod:`.views`), so every subcommand prints the same
table, or with ``--json`` the same JSON document, whichever it reads from.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from psych_sidecar.inspect_command.views import Source

__all__ = ["add_parser", "run"]


def _time(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 time: {text!r}") from error
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"say the time zone (…Z or …+02:00): {text!r}")
    return value


def add_parser(commands: Any) -> None:
    """The `inspect` subcommand and its own subcommands, on the CLI's subparsers."""
    inspect = commands.add_parser(
        "inspect",
        help="read-only views of a sidecar's Runs, prompts and connections, from a running "
        "sidecar (gRPC) or its database",
        description="Read-only views of a sidecar's Runs, prompts and connections. They read "
        "from a running sidecar over gRPC (--address, or the first listen address of the "
        "settings), or with --database-url straight from its database, opened read-only "
        "(never migrated; a schema revision this version does not know is refused). Both "
        "print the same tables and --json documents; from the database, connection states "
        "are the stored ones, not live.",
    )
    common = argparse.ArgumentParser(add_help=False)
    source = common.add_mutually_exclusive_group()
    source.add_argument(
        "--address",
        default=None,
        help="unix:///path or HOST:PORT of a running sidecar (default: the first listen "
        "address of the settings)",
    )
    source.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="read the database instead, read-only: sqlite:///path/to/sidecar.db or "
        "postgresql://user@host/db, the forms the database_url setting takes",
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per call (the database's busy wait)"
    )
    now = argparse.ArgumentParser(add_help=False)
    now.add_argument(
        "--now",
        type=_time,
        default=None,
        metavar="TIME",
        help="assemble the prompt as of this RFC 3339 time (its transient message's clock; "
        "default: now)",
    )
    views = inspect.add_subparsers(dest="view", required=True)
    runs = views.add_parser("runs", parents=[common], help="a tenant's Runs, newest first")
    runs.add_argument("tenant")
    runs.add_argument("--limit", type=int, default=50, help="at most this many Runs")
    log = views.add_parser(
        "log",
        parents=[common, now],
        help="a Run's log: records by kind, tool results, what is elided",
    )
    log.add_argument("run_id")
    prompt = views.add_parser(
        "prompt", parents=[common, now], help="a Run's prompt now, by zone, with sizes and hashes"
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
        "connections",
        parents=[common],
        help="a tenant's MCP connections and their states (from the database: as stored)",
    )
    connections.add_argument("tenant")


def run(arguments: argparse.Namespace, source: Source, out: TextIO | None = None) -> int:
    """Print one inspect view read from `source`; 0, or 1 when the source refused."""
    # Imported by this command only: every command builds the parser above, serve included.
    from psych_sidecar.inspect_command.views import Refused, render

    try:
        data, table = render(source, arguments)
    except Refused as error:
        print(f"{source.where}: {error}", file=sys.stderr)
        return 1
    out = out or sys.stdout
    out.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n" if arguments.json else table)
    return 0

"""What the session registry and the sessions share, apart from the sessions themselves:
importing the MCP SDK they run on is a fifth of a start's imports, so the registry imports
:mod:`psych_sidecar.mcp.session` only when a first connection runs (a sidecar with no MCP
connection never imports the SDK)."""

from __future__ import annotations

from dataclasses import dataclass

from psych_sidecar.domain.catalog import CatalogTool, RejectedTool


@dataclass(frozen=True, slots=True)
class SessionTimings:
    connect_timeout: float
    reconnect_min: float
    reconnect_max: float
    list_changed_debounce: float
    # The sweep's bound: every catalogue is re-listed at least this often.
    catalog_ttl: float = 300.0
    # A server's list `ttlMs` shorter than this counts as this (`ttlMs: 0` is no busy loop).
    min_list_ttl: float = 60.0
    # How long a server's question waits for the host's answer, and how many calls of a
    # 2025-11-25 session may be held open meanwhile.
    input_wait: float = 600.0
    max_held_calls: int = 1000


class CatalogUnavailable(Exception):
    """A refresh could not list the server's tools; nothing was written."""


@dataclass(frozen=True, slots=True)
class Listing:
    """A complete tools/list: the tools the catalogue takes, and the ones it leaves out."""

    tools: list[CatalogTool]
    rejected: list[RejectedTool]
    # How long the server says the listing stays fresh (2026-07-28 `ttlMs`, the shortest of
    # its pages), in seconds; None: it did not say.
    ttl_seconds: float | None = None
    # The tools that declare themselves long-running (`execution.taskSupport`).
    long_running: frozenset[str] = frozenset()

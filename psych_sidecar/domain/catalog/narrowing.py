"""Narrowing: which of a connection's tools a Run may reach.

The permitted set is one catalogue version's tools (the newest, read with its connection),
narrowed by the connection's own allow/deny, then by the Spec's grants (no grant: nothing),
then by the Run's restrictions (when it has any). Every path to a tool — the surface, the meta
tools, search, a call — goes through here, and a call re-runs it against the current
catalogue, so a stale surface reaches nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from psych_sidecar.domain.catalog.connections import CatalogTool, Connection
from psych_sidecar.domain.runlog import ToolGrant


def _segment(text: str) -> str:
    return "".join("." if c == "?" else re.escape(c) for c in text)


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    """The glob as a regular expression that cannot backtrack badly. Patterns come from
    Specs, Runs and connection records (untrusted), so `*a*a*a…b` must not cost
    O(n^k): each segment between two stars is matched at its leftmost occurrence inside an
    atomic group (never revisited, which is exact for globs), so a match costs at most
    O(len(name) x len(pattern))."""
    first, *middle, last = pattern.split("*") if "*" in pattern else (pattern, None)
    if last is None:
        return re.compile(_segment(first), re.DOTALL)
    body = "".join(f"(?>.*?{_segment(part)})" for part in middle)
    return re.compile(f"{_segment(first)}{body}.*{_segment(last)}", re.DOTALL)


def glob_match(pattern: str, name: str) -> bool:
    """`*` matches any run of characters, `?` exactly one; everything else matches itself."""
    if pattern == "*":  # the usual grant: no regular expression needed
        return True
    return _compiled(pattern).fullmatch(name) is not None


def _granted(grants: Iterable[ToolGrant], server: str, tool: str) -> bool:
    return any(
        glob_match(grant.server_pattern, server) and glob_match(grant.tool_pattern, tool)
        for grant in grants
    )


@dataclass(frozen=True, slots=True)
class Grants:
    """What a Run is granted: its Spec's grants and its own restrictions."""

    spec_grants: tuple[ToolGrant, ...]
    run_restrictions: tuple[ToolGrant, ...]

    def permits(self, connection: Connection, tool: CatalogTool) -> bool:
        # Not `tool.removed_in_version`: the tools come from the catalogue version the
        # caller read, and a newer version written since (by any sidecar) marks that
        # version's rows removed; as of the version read they are all there.
        if connection.allow_tools and not any(
            glob_match(pattern, tool.name) for pattern in connection.allow_tools
        ):
            return False
        if any(glob_match(pattern, tool.name) for pattern in connection.deny_tools):
            return False
        if not _granted(self.spec_grants, connection.name, tool.name):
            return False
        return not self.run_restrictions or _granted(
            self.run_restrictions, connection.name, tool.name
        )

    def permitted(self, connection: Connection, tools: Sequence[CatalogTool]) -> list[CatalogTool]:
        """The permitted tools, in the order given (the catalogue's: by name)."""
        return [tool for tool in tools if self.permits(connection, tool)]

    def may_reach_server(self, server: str) -> bool:
        """Whether any tool of the server could be granted at all; a cheap pre-check."""
        if not any(glob_match(g.server_pattern, server) for g in self.spec_grants):
            return False
        return not self.run_restrictions or any(
            glob_match(g.server_pattern, server) for g in self.run_restrictions
        )

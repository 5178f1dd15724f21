"""What prompt assembly needs from outside its concern: the turn's tool surface and states
(:class:`TurnSurfaces`, TurnResolver implements it) and where each prompt's metadata is kept
(:class:`AssemblyJournal`, storage implements it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from psych_sidecar.domain.catalog import ConnectionState
from psych_sidecar.domain.prompt.journal import AssemblyEntry
from psych_sidecar.domain.surface import ToolSurface


class TurnSurfaces(Protocol):
    """What assembly needs of the tool surface (TurnResolver implements it)."""

    def resolve_turn(self, run_id: str) -> ToolSurface:
        """The Run's tool surface for this turn."""
        ...

    def server_states(self, run_id: str) -> Mapping[str, ConnectionState]:
        """The current state of each of the Run's tenant's connections."""
        ...


class AssemblyJournal(Protocol):
    """Where the assembler reports each prompt's metadata; storage implements it."""

    def record(self, entry: AssemblyEntry) -> None:
        """Keep one entry (and drop entries older than the retention)."""
        ...

    def entries(self, run_id: str, limit: int) -> list[AssemblyEntry]:
        """A Run's entries, oldest first: at most the newest `limit`."""
        ...

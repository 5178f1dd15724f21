"""What turn resolution needs from storage: where each turn's surface is pinned."""

from __future__ import annotations

from typing import Protocol


class SurfacePins(Protocol):
    """Where each (Run, turn)'s surface is pinned, shared by every sidecar on the database.
    Implemented in storage/."""

    def pin_surface(self, run_id: str, turn_start: int, surface_json: bytes) -> bytes:
        """Store the surface of a turn unless one is stored already; return the stored one
        (the first pin wins, whichever sidecar made it)."""
        ...

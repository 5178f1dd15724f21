"""Sidecar settings for tests, from the flat keys the CLI and environment use."""

from __future__ import annotations

from typing import Any

from psych_sidecar.config import Settings


def flat_settings(**flat: Any) -> Settings:
    """`Settings(**flat)`: the flat keys (`listen`, `database_url`, `mcp_commands`…) are the
    names of the flags and environment variables, which the settings model nests into its
    groups when it validates; its typed constructor names only the groups."""
    return Settings(**flat)

"""The tool surface of a turn: which tools the model sees, and under which names.

Owns per-turn resolution (:class:`TurnResolver`), disclosure tiers by catalogue size (direct,
facade, search pair), deferral behind the meta tools with one line per deferred server,
provider-legal exposed names, and the definitions of the sidecar's own tools
(``read_tool_output``, ``load_skill``, ``read_history``).
"""

from __future__ import annotations

# A module in the public face: the provider-legal names, and the fixed names of the sidecar's
# own and meta tools, that calls/ needs to route and to word its tool errors.
from psych_sidecar.domain.surface import naming
from psych_sidecar.domain.surface.ports import SurfacePins
from psych_sidecar.domain.surface.resolution import TurnResolver
from psych_sidecar.domain.surface.resolved import ResolvedTurn, RunContext, qualified_names
from psych_sidecar.domain.surface.sidecar_tools import (
    LOAD_SKILL,
    MODEL_DEFAULT_LIMIT_CHARS,
    MODEL_MAX_BINARY_BYTES,
    MODEL_MAX_LIMIT_CHARS,
    READ_HISTORY,
    READ_TOOL_OUTPUT,
    mcp_result_json,
)
from psych_sidecar.domain.surface.tiers import (
    DisclosureLimits,
    DisclosureTier,
    ExposedKind,
    ExposedTool,
    ServerLine,
    ToolSurface,
    VisibleServer,
    one_line,
    resolve_surface,
    status_note,
    tier_for,
)

__all__ = [
    "LOAD_SKILL",
    "MODEL_DEFAULT_LIMIT_CHARS",
    "MODEL_MAX_BINARY_BYTES",
    "MODEL_MAX_LIMIT_CHARS",
    "READ_HISTORY",
    "READ_TOOL_OUTPUT",
    "DisclosureLimits",
    "DisclosureTier",
    "ExposedKind",
    "ExposedTool",
    "ResolvedTurn",
    "RunContext",
    "ServerLine",
    "SurfacePins",
    "ToolSurface",
    "TurnResolver",
    "VisibleServer",
    "mcp_result_json",
    "naming",
    "one_line",
    "qualified_names",
    "resolve_surface",
    "status_note",
    "tier_for",
]

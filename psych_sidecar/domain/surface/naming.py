"""Provider-legal tool names, derived from MCP names alone.

Providers accept tool names matching ``^[a-zA-Z0-9_-]{1,64}$``; MCP server and tool names may
hold anything. A name here is a pure function of the (server, tool) pair — never of what
else is on the surface — so the same tool keeps its name across turns and catalogue changes.

- A *clean* pair reads as itself: ``server__tool``. Clean means every character is legal, the
  server has no ``__`` and does not end in ``_`` (so the first ``__`` is the separator and no
  two clean pairs can spell the same name), and the result fits in 64 characters.
- Anything else is sanitized (illegal characters become ``_``), cut to fit, and suffixed with
  ``_`` and 8 hex digits of the SHA-256 of the exact names.
- A facade is named after its server alone (no ``__``, so never a clean pair's name).

Fixed sidecar names are reserved; a server spelling one of them takes the hashed form.
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME_LENGTH = 64
LEGAL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_ILLEGAL = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_CHARS = 8

# Sidecar tools with fixed names, including those of the log and skills (read_tool_output,
# load_skill, read_history), so no MCP-derived name can take them.
LIST_TOOLS = "mcp_list_tools"
DESCRIBE_TOOL = "mcp_describe_tool"
CALL_TOOL = "mcp_call_tool"
# The key of a stored result passed by reference in a tool call's arguments
# (domain/calls/references.py).
REFERENCE_KEY = "$ref_output"
# What the meta tools' descriptions add when the Spec allows references (one sentence).
REFERENCE_GUIDANCE = (
    f'Any argument value may be {{"{REFERENCE_KEY}": {{"handle": "h_…"}}}}, optionally with '
    '"query" (JMESPath) or "part" (an index), to pass a stored tool result, or what the query '
    "yields of it, without copying it: the sidecar puts the value in place."
)
SEARCH_TOOLS = "mcp_search_tools"
# The step a task's result arrives in calls it (domain/calls/tasks.py); never on a surface.
TASK_RESULT = "mcp_task_result"
CALL_TOOL_BY_NAME = "mcp_call_tool_by_name"
RESERVED_NAMES = frozenset(
    {LIST_TOOLS, DESCRIBE_TOOL, CALL_TOOL, SEARCH_TOOLS, CALL_TOOL_BY_NAME, TASK_RESULT}
    | {"read_tool_output", "load_skill", "read_history"}
)


def _hashed(*parts: str) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:_HASH_CHARS]
    base = _ILLEGAL.sub("_", "__".join(parts))[: MAX_NAME_LENGTH - _HASH_CHARS - 1]
    return f"{base}_{digest}"


def _clean_server(server: str) -> bool:
    return bool(LEGAL_NAME.fullmatch(server)) and "__" not in server and not server.endswith("_")


def tool_name(server: str, tool: str) -> str:
    """The exposed name of one MCP tool: ``server__tool`` when that is legal and unambiguous."""
    joined = f"{server}__{tool}"
    if _clean_server(server) and LEGAL_NAME.fullmatch(joined):
        return joined
    return _hashed(server, tool)


def facade_name(server: str) -> str:
    """The exposed name of a server's facade tool: the server's name when legal."""
    if _clean_server(server) and server not in RESERVED_NAMES:
        return server
    return _hashed(server)


def deduplicated(names: list[str]) -> list[str]:
    """The names with any repeat renamed by position (``_2``, ``_3``…), first keeping its name.

    Only a truncated-hash coincidence can repeat a name; this keeps the surface collision-free
    even then, deterministically for a given surface.
    """
    seen: set[str] = set(names)
    counts: dict[str, int] = {}
    result = []
    for name in names:
        counts[name] = counts.get(name, 0) + 1
        if counts[name] == 1:
            result.append(name)
            continue
        number = counts[name]
        while True:
            suffix = f"_{number}"
            candidate = name[: MAX_NAME_LENGTH - len(suffix)] + suffix
            if candidate not in seen:
                break
            number += 1
        seen.add(candidate)
        result.append(candidate)
    return result

"""The per-turn tool surface: tiers, exposed tools and server lines, from already-narrowed data.

Pure and deterministic: the same connections, permitted tools and settings give the same
surface, byte for byte (tools sorted by name, servers by name, JSON canonical).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from psych_sidecar.domain.canonical import canonical_json, sorted_keys
from psych_sidecar.domain.catalog import (
    DESCRIPTION_PROMPT_CHARS,
    CatalogTool,
    Connection,
    ConnectionState,
    ConnectionStatus,
)
from psych_sidecar.domain.runlog import DisclosureSettings
from psych_sidecar.domain.surface import naming

# A facade's index shows this much of each tool's first description line.
FACADE_INDEX_LINE_CHARS = 120


class DisclosureTier(StrEnum):
    DEFERRED = "deferred"
    DIRECT = "direct"
    FACADE = "facade"
    SEARCH = "search"


class ExposedKind(StrEnum):
    MCP_TOOL = "mcp_tool"
    FACADE = "facade"
    SEARCH = "search"
    CALL_BY_NAME = "call_by_name"
    LIST_DEFERRED_TOOLS = "list_deferred_tools"
    DESCRIBE_DEFERRED_TOOL = "describe_deferred_tool"
    CALL_DEFERRED_TOOL = "call_deferred_tool"
    # The sidecar's own tools (domain/surface/sidecar_tools.py), on every surface.
    READ_TOOL_OUTPUT = "read_tool_output"
    LOAD_SKILL = "load_skill"
    READ_HISTORY = "read_history"


@dataclass(frozen=True, slots=True)
class ExposedTool:
    name: str
    description: str
    input_schema_json: bytes
    kind: ExposedKind
    server: str = ""
    tool: str = ""


@dataclass(frozen=True, slots=True)
class ServerLine:
    server: str
    tier: DisclosureTier
    state: ConnectionState
    permitted_tool_count: int
    text: str
    # The catalogue version the line and the server's tools come from (0: never listed).
    catalog_version: int = 0


@dataclass(frozen=True, slots=True)
class ToolSurface:
    tools: tuple[ExposedTool, ...]
    servers: tuple[ServerLine, ...]

    def to_json(self) -> bytes:
        """Canonical JSON of the whole surface: what a turn's pin stores."""
        return canonical_json(
            {
                "tools": [
                    [
                        t.name,
                        t.description,
                        t.input_schema_json.decode(),
                        t.kind.value,
                        t.server,
                        t.tool,
                    ]
                    for t in self.tools
                ],
                "servers": [
                    [
                        s.server,
                        s.tier.value,
                        s.state.value,
                        s.permitted_tool_count,
                        s.text,
                        s.catalog_version,
                    ]
                    for s in self.servers
                ],
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> ToolSurface:
        value = json.loads(data)
        return cls(
            tuple(
                ExposedTool(name, description, schema.encode(), ExposedKind(kind), server, tool)
                for name, description, schema, kind, server, tool in value["tools"]
            ),
            tuple(
                ServerLine(
                    server, DisclosureTier(tier), ConnectionState(state), count, text, version
                )
                for server, tier, state, count, text, version in value["servers"]
            ),
        )


@dataclass(frozen=True, slots=True)
class DisclosureLimits:
    """DisclosureSettings with the documented defaults applied."""

    auto_preload_max_tools: int = 16
    direct_max_tools: int = 24
    facade_max_tools: int = 200
    result_references: bool = True

    @classmethod
    def of(cls, settings: DisclosureSettings) -> DisclosureLimits:
        values = {
            name: value
            for name in (
                "auto_preload_max_tools",
                "direct_max_tools",
                "facade_max_tools",
                "result_references",
            )
            if (value := getattr(settings, name)) is not None
        }
        return cls(**values)


@dataclass(frozen=True, slots=True)
class VisibleServer:
    """One of the tenant's connections with the tools the Run is permitted on it."""

    connection: Connection
    status: ConnectionStatus
    permitted: tuple[CatalogTool, ...]


def canonical_schema(schema: bytes | dict[str, Any]) -> bytes:
    """An input schema (a server's raw bytes, or one the sidecar wrote) in canonical JSON with
    sorted keys; an object schema whatever was sent, since providers accept only those."""
    if isinstance(schema, bytes):
        try:
            schema = json.loads(schema) if schema else {}
        except ValueError:
            schema = {}
        if not isinstance(schema, dict):
            schema = {}
    schema = {"type": "object", **schema}
    return canonical_json(sorted_keys(schema))


def tier_for(
    connection: Connection, permitted_count: int, limits: DisclosureLimits
) -> DisclosureTier:
    preload = connection.preload
    if preload is None:
        preload = permitted_count <= limits.auto_preload_max_tools
    if not preload:
        return DisclosureTier.DEFERRED
    if permitted_count <= limits.direct_max_tools:
        return DisclosureTier.DIRECT
    if permitted_count <= limits.facade_max_tools:
        return DisclosureTier.FACADE
    return DisclosureTier.SEARCH


def one_line(text: str, limit: int) -> str:
    """Whitespace collapsed to single spaces, cut to `limit` characters with an ellipsis."""
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _first_line(text: str, limit: int) -> str:
    stripped = text.strip()
    return one_line(stripped.splitlines()[0] if stripped else "", limit)


def _line_text(server: VisibleServer, tier: DisclosureTier, eager: list[str]) -> str:
    connection = server.connection
    count = len(server.permitted)
    # No connection state here: the roster sits in zone 2, and a state that flaps mid-turn is
    # said in the transient message (see `status_note`), so the roster changes only when
    # connections, tiers or permitted counts do.
    head = f"{connection.name} ({tier.value}, {count} tool{'s' if count != 1 else ''})"
    description = one_line(connection.description, DESCRIPTION_PROMPT_CHARS)
    how = {
        DisclosureTier.DEFERRED: (
            f"List its tools with {naming.LIST_TOOLS}, read one with {naming.DESCRIBE_TOOL}, "
            f"call one with {naming.CALL_TOOL}."
        ),
        DisclosureTier.DIRECT: "Its tools are offered directly.",
        DisclosureTier.FACADE: (
            f"Its tools are behind the tool {naming.facade_name(connection.name)}."
        ),
        DisclosureTier.SEARCH: (
            f"Find its tools with {naming.SEARCH_TOOLS}, call one with {naming.CALL_TOOL_BY_NAME}."
        ),
    }[tier]
    if eager:
        how += " Offered directly as well: " + ", ".join(eager) + "."
    return f"{head}: {description} {how}" if description else f"{head}. {how}"


def status_note(lines: Sequence[ServerLine], states: Mapping[str, ConnectionState]) -> str:
    """One sentence per server of the turn's roster that is not connected right now (the
    transient message's status part); empty when every one is."""
    notes = []
    for line in lines:
        state = states.get(line.server, line.state)
        if state is ConnectionState.UNREACHABLE:
            notes.append(f"{line.server} is UNREACHABLE: its calls fail until it reconnects.")
        elif state is ConnectionState.AUTHORIZATION_REQUIRED:
            notes.append(f"{line.server} needs the user to sign in: its calls fail until they do.")
        elif state is ConnectionState.CONNECTING:
            notes.append(f"{line.server} is still connecting.")
    return "Tool server status: " + " ".join(notes) if notes else ""


def _object_schema(properties: dict[str, Any], required: list[str]) -> bytes:
    return canonical_schema(
        {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
    )


_SERVER = {"type": "string", "description": "The server's name, as in its prompt line."}
_TOOL = {"type": "string", "description": "The tool's name on that server."}
_INPUT = {"type": "object", "description": "The tool's arguments, as its input schema says."}

META_TOOLS = (
    ExposedTool(
        naming.LIST_TOOLS,
        "List the names of the tools you may use on one MCP server.",
        _object_schema({"server": _SERVER}, ["server"]),
        ExposedKind.LIST_DEFERRED_TOOLS,
    ),
    ExposedTool(
        naming.DESCRIBE_TOOL,
        "Read one MCP tool's description and its input and output schemas.",
        _object_schema({"server": _SERVER, "tool": _TOOL}, ["server", "tool"]),
        ExposedKind.DESCRIBE_DEFERRED_TOOL,
    ),
    ExposedTool(
        naming.CALL_TOOL,
        "Call one MCP tool by its server and name, with arguments matching its input schema.",
        _object_schema({"server": _SERVER, "tool": _TOOL, "input": _INPUT}, ["server", "tool"]),
        ExposedKind.CALL_DEFERRED_TOOL,
    ),
)

SEARCH_PAIR = (
    ExposedTool(
        naming.SEARCH_TOOLS,
        "Search the MCP tools you may use by keywords or an exact tool name; returns the best "
        f"matches with the name to pass to {naming.CALL_TOOL_BY_NAME}.",
        _object_schema(
            {
                "query": {"type": "string", "description": "Keywords, or a tool's exact name."},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 50,
                    "description": "At most this many results; default 10.",
                },
            },
            ["query"],
        ),
        ExposedKind.SEARCH,
    ),
    ExposedTool(
        naming.CALL_TOOL_BY_NAME,
        f"Call an MCP tool by the name {naming.SEARCH_TOOLS} returned, with arguments matching "
        "its input schema.",
        _object_schema(
            {
                "name": {"type": "string", "description": "The tool's name from the search."},
                "input": _INPUT,
            },
            ["name"],
        ),
        ExposedKind.CALL_BY_NAME,
    ),
)


def _telling_of_references(tool: ExposedTool) -> ExposedTool:
    """A tool that calls MCP tools, its description saying that arguments may reference
    stored results (when the Spec allows it)."""
    between = "\n" if "\n" in tool.description else " "
    return dataclasses.replace(
        tool, description=f"{tool.description}{between}{naming.REFERENCE_GUIDANCE}"
    )


_CALLING_KINDS = frozenset(
    {ExposedKind.FACADE, ExposedKind.CALL_DEFERRED_TOOL, ExposedKind.CALL_BY_NAME}
)


def _facade(server: VisibleServer) -> ExposedTool:
    connection = server.connection
    names = [tool.name for tool in server.permitted]
    about = one_line(connection.description, DESCRIPTION_PROMPT_CHARS)
    lines = [
        f"Call one of the {len(names)} tools of MCP server {connection.name}"
        + (f" ({about})" if about else "")
        + f": pass the tool's name as `tool` and its arguments as `input`; read a tool's "
        f"schemas with {naming.DESCRIBE_TOOL}. Tools:"
    ]
    lines += [
        f"- {tool.name}: {_first_line(tool.description, FACADE_INDEX_LINE_CHARS)}".rstrip(": ")
        for tool in server.permitted
    ]
    schema = _object_schema(
        {
            "tool": {"type": "string", "enum": names, "description": "The tool to call."},
            "input": _INPUT,
        },
        ["tool"],
    )
    return ExposedTool(
        naming.facade_name(connection.name),
        "\n".join(lines),
        schema,
        ExposedKind.FACADE,
        server=connection.name,
    )


def _direct(server: str, tool: CatalogTool) -> ExposedTool:
    return ExposedTool(
        naming.tool_name(server, tool.name),
        tool.description,
        canonical_schema(tool.input_schema_json),
        ExposedKind.MCP_TOOL,
        server=server,
        tool=tool.name,
    )


def resolve_surface(servers: Sequence[VisibleServer], limits: DisclosureLimits) -> ToolSurface:
    """The surface for the visible servers: one line each, and tools by tier."""
    tools: list[ExposedTool] = []
    lines: list[ServerLine] = []
    any_search = False
    for server in sorted(servers, key=lambda s: s.connection.name):
        connection = server.connection
        tier = tier_for(connection, len(server.permitted), limits)
        eager: list[str] = []
        if tier is DisclosureTier.DIRECT:
            tools.extend(_direct(connection.name, tool) for tool in server.permitted)
        elif tier is DisclosureTier.FACADE:
            tools.append(_facade(server))
        elif tier is DisclosureTier.SEARCH:
            any_search = True
        else:
            wanted = set(connection.eager_tools)
            for tool in server.permitted:
                if tool.name in wanted:
                    tools.append(_direct(connection.name, tool))
                    eager.append(tool.name)
        lines.append(
            ServerLine(
                connection.name,
                tier,
                server.status.state,
                len(server.permitted),
                _line_text(server, tier, eager),
                server.status.catalog_version,
            )
        )
    if servers:
        tools.extend(META_TOOLS)
    if any_search:
        tools.extend(SEARCH_PAIR)
    if limits.result_references:
        tools = [_telling_of_references(t) if t.kind in _CALLING_KINDS else t for t in tools]
    tools.sort(key=lambda t: (t.name, t.server, t.tool))
    names = naming.deduplicated([t.name for t in tools])
    unique = tuple(
        tool
        if name == tool.name
        else ExposedTool(
            name, tool.description, tool.input_schema_json, tool.kind, tool.server, tool.tool
        )
        for tool, name in zip(tools, names, strict=True)
    )
    return ToolSurface(tuple(sorted(unique, key=lambda t: t.name)), tuple(lines))

"""TurnService.ResolveTurn: the Run's tool surface for this turn, protobuf out.

AssemblePrompt belongs to another module; this servicer defines only ResolveTurn, and the
server answers the RPCs a servicer does not define with UNIMPLEMENTED.
"""

from __future__ import annotations

from typing import Any

import grpc

from psych.sidecar.v1 import connection_pb2, turn_pb2, turn_service_pb2
from psych_sidecar.api.servicers import Blocking
from psych_sidecar.domain.cache import ImmutableCache
from psych_sidecar.domain.connections import ConnectionState
from psych_sidecar.domain.resolution import TurnResolver
from psych_sidecar.domain.surface import DisclosureTier, ExposedKind, ToolSurface

Context = grpc.aio.ServicerContext[Any, Any]

TIERS = {
    DisclosureTier.DEFERRED: turn_pb2.DISCLOSURE_TIER_DEFERRED,
    DisclosureTier.DIRECT: turn_pb2.DISCLOSURE_TIER_DIRECT,
    DisclosureTier.FACADE: turn_pb2.DISCLOSURE_TIER_FACADE,
    DisclosureTier.SEARCH: turn_pb2.DISCLOSURE_TIER_SEARCH,
}
KINDS = {
    ExposedKind.MCP_TOOL: turn_pb2.EXPOSED_TOOL_KIND_MCP_TOOL,
    ExposedKind.FACADE: turn_pb2.EXPOSED_TOOL_KIND_FACADE,
    ExposedKind.SEARCH: turn_pb2.EXPOSED_TOOL_KIND_SEARCH,
    ExposedKind.CALL_BY_NAME: turn_pb2.EXPOSED_TOOL_KIND_CALL_BY_NAME,
    ExposedKind.LIST_DEFERRED_TOOLS: turn_pb2.EXPOSED_TOOL_KIND_LIST_DEFERRED_TOOLS,
    ExposedKind.DESCRIBE_DEFERRED_TOOL: turn_pb2.EXPOSED_TOOL_KIND_DESCRIBE_DEFERRED_TOOL,
    ExposedKind.CALL_DEFERRED_TOOL: turn_pb2.EXPOSED_TOOL_KIND_CALL_DEFERRED_TOOL,
}
STATES = {
    ConnectionState.CONNECTING: connection_pb2.CONNECTION_STATE_CONNECTING,
    ConnectionState.CONNECTED: connection_pb2.CONNECTION_STATE_CONNECTED,
    ConnectionState.UNREACHABLE: connection_pb2.CONNECTION_STATE_UNREACHABLE,
}


def surface_to_proto(surface: ToolSurface) -> turn_pb2.ToolSurface:
    return turn_pb2.ToolSurface(
        tools=[
            turn_pb2.ExposedTool(
                name=tool.name,
                description=tool.description,
                input_schema_json=tool.input_schema_json,
                kind=KINDS[tool.kind],
                server=tool.server,
                tool=tool.tool,
            )
            for tool in surface.tools
        ],
        servers=[
            turn_pb2.ServerLine(
                server=line.server,
                tier=TIERS[line.tier],
                state=STATES[line.state],
                permitted_tool_count=line.permitted_tool_count,
                text=line.text,
            )
            for line in surface.servers
        ],
    )


class TurnServicer:
    """ResolveTurn only (see the module docstring)."""

    def __init__(self, resolver: TurnResolver, blocking: Blocking, cache_size: int = 1024) -> None:
        self._resolver = resolver
        self._blocking = blocking
        # A resolution returns the same surface object while nothing changed, so its response
        # is built once per surface. Entries hold their surface, so an id cannot be reused
        # while its entry lives; responses are never mutated after they are built.
        self._responses = ImmutableCache[
            int, tuple[ToolSurface, turn_service_pb2.ResolveTurnResponse]
        ](cache_size)

    async def ResolveTurn(
        self, request: turn_service_pb2.ResolveTurnRequest, context: Context
    ) -> turn_service_pb2.ResolveTurnResponse:
        surface = await self._blocking(self._resolver.resolve_turn, request.run_id)
        cached = self._responses.get(id(surface))
        if cached is not None and cached[0] is surface:
            return cached[1]
        response = turn_service_pb2.ResolveTurnResponse(surface=surface_to_proto(surface))
        self._responses.put(id(surface), (surface, response))
        return response

"""The meta tools: how a model reaches tools that are not on its surface — a server's facade,
list / describe / call of a deferred server's tools, and the search pair (search, then call a
hit by name). Discovery is a door, not a bypass: every call goes through `McpCalls`, narrowed
like any other."""

from __future__ import annotations

import json
from typing import Any

from psych_sidecar.domain.calls.mcp_calls import McpCalls, RoutedCall, not_found, unknown_server
from psych_sidecar.domain.calls.outcomes import CallResult, ToolResult
from psych_sidecar.domain.catalog import CatalogTool
from psych_sidecar.domain.runlog import OffLoop
from psych_sidecar.domain.surface import naming, one_line, qualified_names

SEARCH_RESULT_LIMIT = 10
SEARCH_DESCRIPTION_CHARS = 300


def partial_ranking_note(keyword_only: int, documents: int) -> str:
    """What the model is told when its search was ranked before every tool was indexed by
    meaning (the host's SearchTools says the same with `partial`): how much of the ranking
    is keywords only, and that the same search will rank better shortly."""
    if keyword_only >= documents:
        what = "The search model is still loading: every tool was matched by keywords only"
    else:
        what = (
            f"Partial ranking: {keyword_only} of {documents} tools are still being indexed "
            "and were matched by keywords only"
        )
    return (
        f"{what}, so a tool that fits may be missing or ranked low. Searching again in a few "
        "seconds ranks them by meaning too."
    )


class MetaTools:
    def __init__(self, mcp: McpCalls, cpu: OffLoop) -> None:
        self._mcp = mcp
        # Ranking (which may build an index) is CPU work: on the CPU threads.
        self._cpu = cpu

    async def facade(self, call: RoutedCall) -> CallResult:
        tool = call.arguments.get("tool")
        if not isinstance(tool, str) or not tool:
            return ToolResult.error(
                "Pass the tool's name as `tool` (a string) and its arguments as `input`."
            )
        return await self._call_input(call, call.route.server, tool)

    async def call_deferred(self, call: RoutedCall) -> CallResult:
        server, tool = call.arguments.get("server"), call.arguments.get("tool")
        if not isinstance(server, str) or not isinstance(tool, str) or not server or not tool:
            return ToolResult.error(
                "Pass `server` and `tool` as strings, and the arguments as `input`."
            )
        return await self._call_input(call, server, tool)

    async def call_by_name(self, call: RoutedCall) -> CallResult:
        name = call.arguments.get("name")
        if not isinstance(name, str) or not name:
            return ToolResult.error(f"Pass a tool's name from {naming.SEARCH_TOOLS} as `name`.")
        target = qualified_names(call.resolved).get(name)
        if target is None and "/" in name:
            server, _, tool = name.partition("/")
            target = (server, tool)
        if target is None:
            return ToolResult.error(
                f"There is no tool named {name!r} you may use; find one with {naming.SEARCH_TOOLS}."
            )
        return await self._call_input(call, *target)

    async def _call_input(self, call: RoutedCall, server: str, tool: str) -> CallResult:
        """The MCP tool a meta tool names, called with the meta tool's `input`."""
        arguments = call.arguments.get("input", {})
        return await self._mcp.call(call.resolved, server, tool, arguments, call.timeout_seconds)

    async def list_tools(self, call: RoutedCall) -> ToolResult:
        server = call.arguments.get("server")
        tools = call.resolved.permitted.get(server) if isinstance(server, str) else None
        if tools is None:
            return unknown_server(call.resolved, server)
        return ToolResult.structured({"server": server, "tools": sorted(tools)})

    async def describe_tool(self, call: RoutedCall) -> ToolResult:
        server, name = call.arguments.get("server"), call.arguments.get("tool")
        tools = call.resolved.permitted.get(server) if isinstance(server, str) else None
        if tools is None:
            return unknown_server(call.resolved, server)
        tool = tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return not_found(call.resolved, str(server), name)
        return ToolResult.structured(_description(str(server), tool))

    async def search(self, call: RoutedCall) -> ToolResult:
        query = call.arguments.get("query")
        limit = call.arguments.get("limit", SEARCH_RESULT_LIMIT)
        if not isinstance(query, str) or not query.strip():
            return ToolResult.error("Pass the keywords, or a tool's exact name, as `query`.")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 50:
            return ToolResult.error("`limit` must be an integer from 1 to 50.")
        hits, ranking = await self._cpu(call.resolved.ranked_search, query, limit)
        found: dict[str, Any] = {
            "query": query,
            "results": [
                {
                    "name": naming.tool_name(hit.server, hit.tool.name),
                    "server": hit.server,
                    "tool": hit.tool.name,
                    "description": one_line(hit.tool.description, SEARCH_DESCRIPTION_CHARS),
                }
                for hit in hits
            ],
        }
        if ranking.partial:
            found["partial"] = True
            found["note"] = partial_ranking_note(ranking.keyword_only, ranking.documents)
        return ToolResult.structured(found)


def _description(server: str, tool: CatalogTool) -> dict[str, Any]:
    described: dict[str, Any] = {
        "server": server,
        "tool": tool.name,
        "description": tool.description,
        "input_schema": _json_or_empty(tool.input_schema_json),
    }
    if tool.output_schema_json:
        described["output_schema"] = _json_or_empty(tool.output_schema_json)
    if tool.annotations_json:
        described["annotations"] = _json_or_empty(tool.annotations_json)
    return described


def _json_or_empty(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {}

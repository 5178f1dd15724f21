"""An MCP test server, on the MCP SDK's lowlevel Server, that supports the tasks extension
(`io.modelcontextprotocol/tasks`, 2026-07-28) the way the extension's text describes.

    python tests/mcp_servers/task_server.py --port P

Over streamable HTTP: a remote service whose tasks outlive any one client (a test restarts
the sidecar while a task runs). The fixture server takes the same tools with `--tasks`
(`TaskJobs`), over stdio too (the contract suite's scenarios). Tools:

- `job` (`name`): with the extension declared on the request, starts a task and answers at once
  with its handle (`resultType: "task"`); without it, answers at once "job NAME ran" (a
  server must not start a task for a client that did not declare the extension);
- `finish` (`name`, `outcome` "complete", "tool_error" or "fail"): ends the job's task:
  completed with "job NAME done" (or a result with isError), or failed with a JSON-RPC error;
- `cancels`: the task ids tasks/cancel was asked for, as JSON;
- `ask_job` (`name`, `questions`: 1 or more; this server's listing only, not the fixture
  server's): starts a task that asks its user first, `input_required` with that many
  elicitation forms in `inputRequests` (keys `NAME-1`, `NAME-2`, ...); once every one is
  answered with `tasks/update` it completes with "job NAME answered: KEY=ACTION CONTENT; ...".

`tasks/get` answers the task's state (its result or error once ended, its pending input
requests while input_required), -32602 for a task it does not know; `tasks/update` takes
answers to some or all pending requests (acked empty; the answered keys leave
`inputRequests`); `tasks/cancel` marks a working or waiting task cancelled. All refuse a
request that did not declare the extension (-32021).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from pydantic import Field

TASKS = "io.modelcontextprotocol/tasks"
CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
_NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
TOOLS = [
    types.Tool(name="job", description="Runs a job as a task when it may.", input_schema=_NAME),
    types.Tool(
        name="finish",
        description="Ends a job's task.",
        input_schema={
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "outcome": {"type": "string", "enum": ["complete", "tool_error", "fail"]},
            },
            "required": ["name", "outcome"],
        },
    ),
    types.Tool(
        name="cancels",
        description="The task ids tasks/cancel was asked for.",
        input_schema={"type": "object", "properties": {}},
    ),
]


ASKING_TOOLS = [
    types.Tool(
        name="ask_job",
        description="Runs a job as a task that asks its user first.",
        input_schema={
            "type": "object",
            "properties": {"name": {"type": "string"}, "questions": {"type": "integer"}},
            "required": ["name"],
        },
    )
]
_CONFIRM = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean"}},
    "required": ["confirm"],
}


class TaskParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


def _declared(meta: Any) -> bool:
    if meta is None:
        return False
    data = meta if isinstance(meta, dict) else meta.model_dump(by_alias=True)
    capabilities = data.get(CAPABILITIES) or {}
    return TASKS in (capabilities.get("extensions") or {})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class TaskJobs:
    """The task tools and the extension's methods, on any lowlevel Server (`install`); the
    fixture server takes them with `--tasks`."""

    names = frozenset(tool.name for tool in TOOLS)
    tools = TOOLS

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.by_job: dict[str, str] = {}
        self.cancels: list[str] = []

    def install(self, server: Server[Any]) -> None:
        server.extensions[TASKS] = {}
        server.add_request_handler("tasks/get", TaskParams, self.get)
        server.add_request_handler("tasks/cancel", TaskParams, self.cancel)
        server.add_request_handler("tasks/update", UpdateParams, self.update)

    def _shape(self, task_id: str) -> dict[str, Any]:
        task = self.tasks[task_id]
        return {
            "taskId": task_id,
            "status": task["status"],
            "statusMessage": task["message"],
            "createdAt": task["created"],
            "lastUpdatedAt": task["updated"],
            "ttlMs": 3_600_000,
            "pollIntervalMs": 100,
        }

    async def call_tool(self, params: types.CallToolRequestParams) -> Any:
        arguments = params.arguments or {}
        if params.name == "job":
            name = str(arguments["name"])
            if not _declared(params.meta):
                return _text(f"job {name} ran")
            task_id = uuid.uuid4().hex
            now = _now()
            self.tasks[task_id] = {
                "status": "working",
                "message": f"job {name} is running",
                "created": now,
                "updated": now,
            }
            self.by_job[name] = task_id
            return {"resultType": "task", **self._shape(task_id)}
        if params.name == "ask_job":
            name = str(arguments["name"])
            if not _declared(params.meta):
                return _text(f"job {name} ran")
            task_id = uuid.uuid4().hex
            now = _now()
            pending = {}
            for number in range(1, int(arguments.get("questions", 1)) + 1):
                form = types.ElicitRequestFormParams(
                    message=f"Go ahead with job {name}? (question {number})",
                    requested_schema=_CONFIRM,
                )
                request = types.ElicitRequest(params=form)
                pending[f"{name}-{number}"] = request.model_dump(
                    by_alias=True, mode="json", exclude_none=True
                )
            self.tasks[task_id] = {
                "status": "input_required",
                "message": f"job {name} waits for its user",
                "created": now,
                "updated": now,
                "pending": pending,
                "answers": [],
                "name": name,
            }
            self.by_job[name] = task_id
            return {"resultType": "task", **self._shape(task_id)}
        if params.name == "finish":
            task = self.tasks[self.by_job[str(arguments["name"])]]
            name, outcome = arguments["name"], arguments["outcome"]
            task["updated"] = _now()
            if outcome == "fail":
                task["status"] = "failed"
                task["message"] = f"job {name} failed"
                task["error"] = {"code": -32603, "message": f"job {name} broke"}
            else:
                task["status"] = "completed"
                task["message"] = f"job {name} done"
                result = _text(f"job {name} done", outcome == "tool_error")
                task["result"] = result.model_dump(by_alias=True, exclude_none=True)
            return _text("finished")
        return _text(json.dumps(self.cancels))

    async def get(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        if not _declared(params.meta):
            raise MCPError(-32021, "Missing required client capability")
        if params.task_id not in self.tasks:
            raise MCPError(types.INVALID_PARAMS, "Failed to retrieve task: Task not found")
        task = self.tasks[params.task_id]
        answer = {"resultType": "complete", **self._shape(params.task_id)}
        if task["status"] == "input_required":
            answer["inputRequests"] = task["pending"]
        elif task["status"] == "completed":
            answer["result"] = task["result"]
        elif task["status"] == "failed":
            answer["error"] = task["error"]
        return answer

    async def cancel(self, ctx: Any, params: TaskParams) -> dict[str, Any]:
        if not _declared(params.meta):
            raise MCPError(-32021, "Missing required client capability")
        if params.task_id not in self.tasks:
            raise MCPError(types.INVALID_PARAMS, "Task not found")
        self.cancels.append(params.task_id)
        task = self.tasks[params.task_id]
        if task["status"] in ("working", "input_required"):
            task["status"] = "cancelled"
            task["message"] = "cancelled on request"
            task["updated"] = _now()
        return {"resultType": "complete"}

    async def update(self, ctx: Any, params: UpdateParams) -> dict[str, Any]:
        if not _declared(params.meta):
            raise MCPError(-32021, "Missing required client capability")
        if params.task_id not in self.tasks:
            raise MCPError(types.INVALID_PARAMS, "Task not found")
        task = self.tasks[params.task_id]
        if task["status"] != "input_required":
            return {"resultType": "complete"}
        for key, response in params.input_responses.items():
            if key in task["pending"]:
                del task["pending"][key]
                content = json.dumps(response.get("content"), sort_keys=True)
                task["answers"].append(f"{key}={response.get('action')} {content}")
        task["updated"] = _now()
        if not task["pending"]:
            task["status"] = "completed"
            task["message"] = f"job {task['name']} done"
            said = f"job {task['name']} answered: " + "; ".join(task["answers"])
            task["result"] = _text(said).model_dump(by_alias=True, exclude_none=True)
        return {"resultType": "complete"}


def _text(value: str, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=value)], is_error=is_error
    )


def build_server() -> Server[Any]:
    jobs = TaskJobs()

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS + ASKING_TOOLS)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
        return await jobs.call_tool(params)

    server: Server[Any] = Server(
        "psych-task-fixture", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool
    )
    jobs.install(server)
    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args()
    app = build_server().streamable_http_app()
    config = uvicorn.Config(app, host="127.0.0.1", port=options.port, log_level="warning")
    print(f"listening on {options.port}", file=sys.stderr, flush=True)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()

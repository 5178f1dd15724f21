"""Third-party MCP servers, installed by scripts/install-mcp-peers, connected for real through
the sidecar: mcp-server-time and mcp-server-git (PyPI, Python SDK), server-everything over stdio,
streamable HTTP and SSE, and Twilio's 1,409-tool catalogue (npm, TypeScript SDK)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from psych_sidecar.domain.catalog import McpToolRequest, McpToolResult
from psych_sidecar.domain.runlog import PartKind
from tests.support.connections import PEERS_DIR, catalog_names, put_http, put_stdio
from tests.support.processes import HttpServer, free_port, running
from tests.support.sidecar import RunningSidecar, Stubs, on_loop

VENV_BIN = Path(sys.executable).parent
EVERYTHING = PEERS_DIR / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
TWILIO = PEERS_DIR / "@twilio-alpha" / "mcp"
# Dummy credentials of the right shape: Twilio's server lists its tools without calling out.
TWILIO_CREDENTIALS = f"AC{'0' * 32}/SK{'0' * 32}:secret"
EVERYTHING_TOOLS = {
    "echo",
    "get-annotated-message",
    "get-env",
    "get-resource-links",
    "get-resource-reference",
    "get-structured-content",
    "get-sum",
    "get-tiny-image",
    "gzip-file-as-resource",
    "toggle-simulated-logging",
    "toggle-subscriber-updates",
    "trigger-long-running-operation",
}


def _node() -> str:
    node = shutil.which("node")
    if node is None or not EVERYTHING.is_file() or not TWILIO.is_dir():
        pytest.fail("the npm MCP peers are missing: run scripts/install-mcp-peers")
    return node


def _twilio_argv() -> list[str]:
    services = sorted(p.stem for p in (TWILIO / "twilio-oai" / "spec" / "json").glob("*.json"))
    return [
        _node(),
        str(TWILIO / "build" / "index.js"),
        TWILIO_CREDENTIALS,
        "--services",
        ",".join(services),
    ]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway git repository with one commit, for mcp-server-git."""
    path = tmp_path_factory.mktemp("repo")

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    git("init", "--initial-branch=main")
    (path / "README.md").write_text("hello\n")
    git("add", "README.md")
    git("-c", "user.name=Test", "-c", "user.email=t@example.com", "commit", "-m", "first commit")
    return path


# One listener is enough: these tests are about MCP peers, not the gRPC transport.
SIDECAR_TRANSPORTS = ["unix"]


@pytest.fixture(scope="module")
def sidecar_overrides(repository: Path) -> dict[str, Any]:
    """The peers as operator-allowed commands (the git server fixed to the throwaway repo)."""
    for program in ("mcp-server-time", "mcp-server-git"):
        if not (VENV_BIN / program).is_file():
            pytest.fail(f"{program} is missing: run scripts/install-mcp-peers")
    node = _node()
    return {
        "mcp_commands": {
            "time": {"argv": [str(VENV_BIN / "mcp-server-time"), "--local-timezone", "UTC"]},
            "git": {"argv": [str(VENV_BIN / "mcp-server-git"), "--repository", str(repository)]},
            "everything": {"argv": [node, str(EVERYTHING), "stdio"]},
            "twilio": {"argv": _twilio_argv()},
        },
        "mcp_connect_timeout_seconds": 60,
    }


def call(
    server: RunningSidecar, tenant: str, name: str, tool: str, arguments: dict[str, Any]
) -> McpToolResult:
    runner = server.sidecar.tool_runner
    request = McpToolRequest(tenant=tenant, server=name, tool=tool, arguments=arguments)
    result = on_loop(server, runner.call_tool(request, 30))
    assert isinstance(result, McpToolResult), result  # none of these tools asks for input
    return result


def text(result: McpToolResult) -> str:
    assert not result.is_error, result.result_json
    return "".join(part.as_text() for part in result.content if part.kind is PartKind.TEXT)


def test_mcp_server_time(grpc_server: RunningSidecar, stubs: Stubs, tenant: str) -> None:
    connection = put_stdio(stubs, tenant, "time", command="time")
    assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED
    assert catalog_names(stubs, tenant, "time") == ["convert_time", "get_current_time"]
    now = json.loads(
        text(call(grpc_server, tenant, "time", "get_current_time", {"timezone": "UTC"}))
    )
    assert now["timezone"] == "UTC"
    converted = call(
        grpc_server,
        tenant,
        "time",
        "convert_time",
        {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
    )
    assert json.loads(text(converted))["target"]["datetime"].startswith(now["datetime"][:4])
    assert call(
        grpc_server, tenant, "time", "get_current_time", {"timezone": "Mars/Olympus"}
    ).is_error


def test_mcp_server_git_on_a_throwaway_repository(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str, repository: Path
) -> None:
    put_stdio(stubs, tenant, "git", command="git")
    names = catalog_names(stubs, tenant, "git")
    assert len(names) == 12
    assert {"git_status", "git_log", "git_diff_unstaged"} <= set(names)
    log = text(call(grpc_server, tenant, "git", "git_log", {"repo_path": str(repository)}))
    assert "first commit" in log
    (repository / "README.md").write_text("hello, world\n")
    diff = text(
        call(grpc_server, tenant, "git", "git_diff_unstaged", {"repo_path": str(repository)})
    )
    assert "+hello, world" in diff


def _exercise_everything(grpc_server: RunningSidecar, stubs: Stubs, tenant: str, name: str) -> None:
    assert set(catalog_names(stubs, tenant, name)) >= EVERYTHING_TOOLS
    assert text(call(grpc_server, tenant, name, "echo", {"message": "hello"})) == "Echo: hello"
    assert "5" in text(call(grpc_server, tenant, name, "get-sum", {"a": 2, "b": 3}))
    image = call(grpc_server, tenant, name, "get-tiny-image", {})
    binary = [part for part in image.content if part.kind is PartKind.BINARY]
    assert binary
    assert binary[0].mime_type == "image/png"
    assert binary[0].data.startswith(b"\x89PNG")
    structured = call(grpc_server, tenant, name, "get-structured-content", {"location": "New York"})
    assert structured.content[-1].kind is PartKind.JSON
    assert b'"structuredContent"' in structured.result_json


def test_server_everything_over_stdio(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str
) -> None:
    connection = put_stdio(stubs, tenant, "everything", command="everything")
    assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED
    _exercise_everything(grpc_server, stubs, tenant, "everything")


@pytest.mark.parametrize(
    ("mode", "path", "protocol"),
    [
        ("streamableHttp", "/mcp", connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP),
        ("sse", "/sse", connection_pb2.HTTP_PROTOCOL_SSE),
    ],
)
def test_server_everything_over_http(
    grpc_server: RunningSidecar, stubs: Stubs, tenant: str, mode: str, path: str, protocol: int
) -> None:
    port = free_port()
    server = HttpServer([_node(), str(EVERYTHING), mode], port, env={"PORT": str(port)})
    with running(server):
        url = f"http://127.0.0.1:{port}{path}"
        connection = put_http(stubs, tenant, "everything", url, protocol=protocol)
        assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED, connection.last_error
        _exercise_everything(grpc_server, stubs, tenant, "everything")


def test_twilio_with_every_service_lists_1409_tools(stubs: Stubs, tenant: str) -> None:
    connection = put_stdio(stubs, tenant, "twilio", command="twilio")
    assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED, connection.last_error
    assert connection.catalog_version == 1
    names = catalog_names(stubs, tenant, "twilio")
    assert len(names) == 1409
    assert len(set(names)) == 1409
    unchanged = stubs.connections.RefreshCatalog(
        connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="twilio")
    )
    assert (unchanged.catalog_version, unchanged.tool_count) == (1, 1409)
    # Every tool is judged alone; none of a real server's is left out.
    assert (connection.rejected_tool_count, unchanged.rejected_tool_count) == (0, 0)

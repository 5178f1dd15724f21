"""How the sidecar introduces itself to an MCP server, and what a host and the model are told
when a server refuses it for want of authorization: through gRPC, against a real loopback
server that records what the sidecar sends (tests/mcp_servers/recording_server.py)."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from psych.sidecar.v1 import connection_pb2
from psych_sidecar import __version__
from tests.support.connections import listed, put_http
from tests.support.host import Host, result_text
from tests.support.polling import wait_for
from tests.support.processes import HttpServer, free_port, running
from tests.support.sidecar import Stubs

RECORDING_SERVER = Path(__file__).parent / "mcp_servers" / "recording_server.py"
SECRET = "s3cret-bearer-value"


# SQLite: what is under test is the MCP side.
SIDECAR_DATABASES = ["sqlite"]
# Loopback TCP.
SIDECAR_TRANSPORTS = ["tcp"]


@pytest.fixture(scope="module")
def sidecar_overrides() -> dict[str, Any]:
    return {"mcp_reconnect_min_seconds": 0.2, "mcp_reconnect_max_seconds": 1.0}


def recording_server(*arguments: str) -> Iterator[HttpServer]:
    port = free_port()
    argv = [sys.executable, str(RECORDING_SERVER), "--port", str(port), *arguments]
    with running(HttpServer(argv, port)) as server:
        yield server


def recorded(server: HttpServer) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/recorded", timeout=10) as answer:
        messages: list[dict[str, Any]] = json.load(answer)
        return messages


def url(server: HttpServer) -> str:
    return f"http://127.0.0.1:{server.port}/mcp"


def settled(stubs: Stubs, tenant: str, name: str, state: int) -> connection_pb2.Connection:
    def reached() -> connection_pb2.Connection | None:
        connection = listed(stubs, tenant).get(name)
        return connection if connection is not None and connection.state == state else None

    return wait_for(reached, f"{tenant}/{name} in state {state}")


def test_the_sidecar_names_itself_and_its_version_and_declares_elicitation_alone(
    stubs: Stubs, tenant: str
) -> None:
    for server in recording_server():
        put_http(stubs, tenant, "plain", url(server))
        settled(stubs, tenant, "plain", connection_pb2.CONNECTION_STATE_CONNECTED)
        (initialize,) = [m for m in recorded(server) if m.get("method") == "initialize"]
    params = initialize["params"]
    assert params["clientInfo"] == {"name": "psych-sidecar", "version": __version__}
    # Elicitation, form and URL mode (the host's user answers); no roots, no sampling.
    assert params["capabilities"] == {"elicitation": {"form": {}, "url": {}}}


def test_a_401_is_the_connections_last_error_with_the_servers_challenge(
    stubs: Stubs, tenant: str
) -> None:
    challenge = 'Bearer resource_metadata="http://127.0.0.1:9/.well-known/prm", scope="files:read"'
    for server in recording_server("--refuse", "401", "--challenge", challenge):
        put_http(stubs, tenant, "guarded", url(server))
        connection = settled(stubs, tenant, "guarded", connection_pb2.CONNECTION_STATE_UNREACHABLE)
    assert connection.last_error == (
        "HTTP 401 Unauthorized: the server requires authorization (sign-in); "
        f"WWW-Authenticate: {challenge}"
    )


def test_a_401_to_an_sse_client_is_reported_the_same_way(stubs: Stubs, tenant: str) -> None:
    for server in recording_server("--refuse", "401", "--challenge", "Bearer realm=files"):
        put_http(stubs, tenant, "legacy", url(server), protocol=connection_pb2.HTTP_PROTOCOL_SSE)
        connection = settled(stubs, tenant, "legacy", connection_pb2.CONNECTION_STATE_UNREACHABLE)
    assert connection.last_error == (
        "HTTP 401 Unauthorized: the server requires authorization (sign-in); "
        "WWW-Authenticate: Bearer realm=files"
    )


def test_a_403_names_its_status_without_the_connections_secrets_and_a_long_challenge_is_cut(
    stubs: Stubs, tenant: str
) -> None:
    # A server quoting the credential it refused, at length: the error keeps neither.
    challenge = f'Bearer error="insufficient_scope", error_description="{SECRET} {"x" * 2000}"'
    for server in recording_server("--refuse", "403", "--challenge", challenge):
        put_http(stubs, tenant, "forbidden", url(server), headers={"Authorization": SECRET})
        connection = settled(
            stubs, tenant, "forbidden", connection_pb2.CONNECTION_STATE_UNREACHABLE
        )
    error = connection.last_error
    assert error.startswith(
        "HTTP 403 Forbidden: the server refused the credentials it was given; "
        'WWW-Authenticate: Bearer error="insufficient_scope", error_description="REDACTED x'
    )
    assert SECRET not in error
    assert error.endswith("…")
    assert len(error) < 400


def test_a_call_refused_with_403_says_so_with_the_challenge(
    stubs: Stubs, tenant: str, unique: Callable[[str], str]
) -> None:
    host = Host(stubs, tenant)
    run_id = host.run(unique("spec"))
    challenge = 'Bearer error="insufficient_scope", scope="files:write"'
    for server in recording_server("--refuse", "403", "--challenge", challenge, "--only-calls"):
        put_http(stubs, tenant, "scoped", url(server))
        settled(stubs, tenant, "scoped", connection_pb2.CONNECTION_STATE_CONNECTED)
        outcome = host.call(run_id, "scoped", "guarded")
    assert outcome.is_error
    assert result_text(outcome) == (
        "scoped/guarded did not answer: MCP server 'scoped' refused the call to 'guarded': "
        "HTTP 403 Forbidden: the server refused the credentials it was given; "
        f"WWW-Authenticate: {challenge}"
    )


def test_a_call_to_a_server_that_never_listed_says_it_is_unreachable_and_why(
    stubs: Stubs, tenant: str, unique: Callable[[str], str]
) -> None:
    host = Host(stubs, tenant)
    run_id = host.run(unique("spec"))
    for server in recording_server("--refuse", "401", "--challenge", "Bearer"):
        put_http(stubs, tenant, "guarded", url(server))
        settled(stubs, tenant, "guarded", connection_pb2.CONNECTION_STATE_UNREACHABLE)
        outcome = host.call(run_id, "guarded", "search_issues")
    assert outcome.is_error
    text = result_text(outcome)
    assert "There is no tool" not in text
    assert "MCP server 'guarded' has not listed its tools: it is unreachable since " in text
    assert "HTTP 401 Unauthorized: the server requires authorization (sign-in)" in text

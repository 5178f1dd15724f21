"""Security boundaries, tried as an attacker would, against the real server (docs/security.md).

Untrusted: the model (tool arguments, grep patterns), MCP servers (schemas, results, stderr)
and connection records (what a host puts through ConnectionService). Trusted: the operator's
configuration and the host machine. Each test here failed on the code before its fix.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from psych.sidecar.v1 import connection_service_pb2
from tests.conftest import Stubs, rpc_failure
from tests.mcp_helpers import fixture_commands, listed, put_stdio

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the `marker` command leaves a file named after its argument when it starts, so a
    test can tell whether a process was started at all."""
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def sidecar_overrides(marker_dir: Path) -> dict[str, Any]:
    """The fixture server, plus `marker`: a process that only proves it was started."""
    touch = "import pathlib, sys; pathlib.Path(sys.argv[1], sys.argv[2]).touch()"
    return {
        "mcp_commands": {
            **fixture_commands(),
            "marker": {
                "argv": [sys.executable, "-c", touch, str(marker_dir)],
                "allow_extra_args": True,
                "allowed_env": ["APP_*", "PYTHONUNBUFFERED"],
            },
        },
        "mcp_connect_timeout_seconds": 10,
        "mcp_reconnect_min_seconds": 30,
    }


# 1. A connection's environment is the operator's to allow.


@pytest.mark.parametrize(
    "env",
    [
        {"LD_PRELOAD": "/tmp/evil.so"},
        {"PYTHONPATH": "/tmp/evil"},
        {"PYTHONSTARTUP": "/tmp/evil.py"},
        {"NODE_OPTIONS": "--require /tmp/evil.js"},
        {"PATH": "/tmp/evil"},
        {"APP_TOKEN": "fine", "LD_LIBRARY_PATH": "/tmp/evil"},
        {"UNLISTED": "x"},
    ],
    ids=lambda env: "+".join(env),
)
def test_a_connection_cannot_set_loader_or_interpreter_variables(
    stubs: Stubs, unique: Callable[[str], str], marker_dir: Path, env: dict[str, str]
) -> None:
    tenant, name = unique("tenant"), unique("conn")
    failure = rpc_failure(lambda: put_stdio(stubs, tenant, name, "marker", [name], env=env))
    assert failure.code == grpc.StatusCode.PERMISSION_DENIED
    assert failure.info.reason == "COMMAND_NOT_ALLOWED"
    assert failure.info.metadata["command"] == "marker"
    assert failure.info.metadata["env"] in env
    # Nothing stored, no process started.
    assert name not in listed(stubs, tenant)
    assert not (marker_dir / name).exists()


def test_the_env_names_the_operator_allows_reach_the_process(
    stubs: Stubs, unique: Callable[[str], str], marker_dir: Path
) -> None:
    tenant, name = unique("tenant"), unique("conn")
    env = {"APP_TOKEN": "t", "PYTHONUNBUFFERED": "1"}  # a prefix entry, and an exact one
    put_stdio(stubs, tenant, name, "marker", [name], env=env)
    assert (marker_dir / name).exists()
    stubs.connections.DeleteConnection(
        connection_service_pb2.DeleteConnectionRequest(tenant=tenant, name=name)
    )

"""Fixtures of the Python contract runner: one real `psych-sidecar serve` process per
transport, reached through pytest-grpc's own channel fixture.

pytest-grpc's `grpc_create_channel` dials `grpc_addr` once `grpc_server` is up; this file
overrides those two (and `grpc_channel`, which tests/conftest.py overrides for the in-process
server) so the channel is the plugin's, the server a separate process started as a host
would start it.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.contract.python.engine import CONTRACT_DIR, scenario_files

MAX_MESSAGE_BYTES = 1_048_576
READY_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 30.0
COUNTS_ENV = "PSYCH_CONTRACT_COUNTS"
FIXTURE_SERVER = CONTRACT_DIR.parent / "mcp_servers" / "fixture_server.py"

# Scenarios that passed, per transport; reported by pytest_terminal_summary.
PASSED: collections.Counter[str] = collections.Counter()


def sidecar_command() -> list[str]:
    """$PSYCH_SIDECAR_BIN (as scripts/test-contract sets it for all three runners), else the
    console script beside this Python, else `python -m psych_sidecar`."""
    configured = os.environ.get("PSYCH_SIDECAR_BIN")
    if configured:
        found = shutil.which(configured)
        if found is None:
            pytest.exit(f"PSYCH_SIDECAR_BIN={configured} is not a program", returncode=1)
        return [found]
    beside = Path(sys.executable).parent / "psych-sidecar"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("psych-sidecar")
    return [found] if found else [sys.executable, "-m", "psych_sidecar"]


def mcp_commands(command: list[str]) -> str:
    """PSYCH_SIDECAR_MCP_COMMANDS for the sidecar (README.md, "MCP servers"): the project's
    fixture server over stdio as command `fixture`, run by the Python beside the sidecar's
    program, which has `mcp` (the sidecar is an MCP client)."""
    python = sys.executable if command[0] == sys.executable else Path(command[0]).parent / "python"
    if not Path(python).exists():
        pytest.exit(f"no python beside {command[0]} to run the MCP fixture server", returncode=1)
    argv = [str(python), str(FIXTURE_SERVER), "stdio"]
    return json.dumps(
        {"fixture": {"argv": argv, "allow_extra_args": True, "allowed_env": ["FIXTURE_*"]}}
    )


def free_loopback_port() -> int:
    """A port the OS reports free now (racy in principle; the sidecar then fails to start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module", params=["unix", "tcp"])
def transport(request: pytest.FixtureRequest) -> str:
    """Each scenario runs over a Unix socket and over loopback TCP."""
    return str(request.param)


@pytest.fixture(scope="module")
def grpc_addr(transport: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Overrides pytest-grpc's: the channel target of the sidecar process."""
    if transport == "unix":
        return f"unix:{tmp_path_factory.mktemp('sock') / 's.sock'}"
    return f"127.0.0.1:{free_loopback_port()}"


@dataclass
class SidecarProcess:
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def grpc_server(
    grpc_addr: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    """Overrides pytest-grpc's in-process server: `psych-sidecar serve` as its own process,
    SQLite in a temporary directory, the smallest message limit (so an oversized request
    stays small), waited for on grpc.health.v1 and stopped with SIGTERM."""
    directory = tmp_path_factory.mktemp("sidecar")
    listen = (
        f"unix://{grpc_addr.removeprefix('unix:')}" if grpc_addr.startswith("unix:") else grpc_addr
    )
    log = directory / "sidecar.log"
    command = sidecar_command()
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                *command,
                "serve",
                "--listen",
                listen,
                "--database-url",
                f"sqlite:///{directory / 'sidecar.db'}",
                "--data-dir",
                str(directory),
                "--max-message-bytes",
                str(MAX_MESSAGE_BYTES),
            ],
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("PSYCH_SIDECAR_")},
                "PSYCH_SIDECAR_MCP_COMMANDS": mcp_commands(command),
                # The OAuth test server of the sign-in scenarios is on loopback, over http.
                "PSYCH_SIDECAR_OAUTH_ALLOW_HTTP_LOOPBACK": "true",
            },
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    sidecar = SidecarProcess(process, log)
    try:
        _wait_serving(grpc_addr, sidecar)
        yield sidecar
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, f"sidecar exit {process.returncode}:\n{sidecar.output()}"


def _wait_serving(target: str, sidecar: SidecarProcess) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    last = "no answer"
    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if sidecar.process.poll() is not None:
                pytest.fail(f"sidecar exited before it was ready:\n{sidecar.output()}")
            try:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            except grpc.RpcError as error:
                last = str(error.code())
            time.sleep(0.1)
    pytest.fail(
        f"sidecar not SERVING within {READY_TIMEOUT_SECONDS} s ({last}):\n{sidecar.output()}"
    )


@pytest.fixture(scope="module")
def grpc_channel(grpc_create_channel: Callable[..., Any]) -> Iterator[grpc.Channel]:
    """pytest-grpc's channel, exactly as the plugin makes it (tests/conftest.py replaces the
    plugin's for the in-process server; this puts the plugin's back)."""
    with grpc_create_channel() as channel:
        yield channel


@pytest.fixture
def scenario_passed(transport: str) -> Callable[[], None]:
    """Counts a scenario that ran to the end; only passes are counted, so a skip shows."""
    return lambda: PASSED.update([transport])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    total = len(scenario_files())
    counts_file = os.environ.get(COUNTS_ENV)
    for transport_name in ("unix", "tcp"):
        count = PASSED[transport_name]
        terminalreporter.write_line(
            f"contract: python ran {count} of {total} scenarios over {transport_name}"
        )
        if counts_file:
            with open(counts_file, "a", encoding="utf-8") as counts:
                counts.write(f"python {transport_name} {count}\n")

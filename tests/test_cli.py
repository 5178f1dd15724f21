"""The psych-sidecar command as an operator runs it: a real process, real signals."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psych.sidecar.v1 import run_service_pb2, run_service_pb2_grpc
from psych_sidecar import __version__
from psych_sidecar.config import load_settings, parse_listen_address
from tests.mcp_helpers import free_port
from tests.test_storage import HEAD_REVISION

COMMAND = [sys.executable, "-m", "psych_sidecar"]


def _health(target: str) -> int | None:
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        except grpc.RpcError:
            return None
        return response.status


def _wait_for(target: str, status: int, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _health(target) == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"{target} did not report {status} within {within}s")


def test_version_prints_the_package_version() -> None:
    output = subprocess.run([*COMMAND, "version"], capture_output=True, text=True, check=True)
    assert output.stdout.strip() == __version__


def test_serve_with_defaults_is_serving_on_a_unix_socket_and_sqlite_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PSYCH_SIDECAR_")}
    process = subprocess.Popen([*COMMAND, "serve"], cwd=tmp_path, env=env, stderr=subprocess.PIPE)
    try:
        socket_path = tmp_path / "psych-sidecar-data" / "sidecar.sock"
        _wait_for(f"unix:{socket_path}", health_pb2.HealthCheckResponse.SERVING, within=10)
        assert (tmp_path / "psych-sidecar-data" / "sidecar.db").exists()
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o660
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr.decode()
    assert not socket_path.exists()


def test_sigterm_reports_not_serving_then_exits(tmp_path: Path) -> None:
    socket_path = tmp_path / "s.sock"
    env = {**os.environ, "PSYCH_SIDECAR_DRAIN_DELAY_SECONDS": "3"}
    process = subprocess.Popen(
        [
            *COMMAND,
            "serve",
            "--listen",
            f"unix://{socket_path}",
            "--database-url",
            f"sqlite:///{tmp_path / 'db'}",
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    target = f"unix:{socket_path}"
    try:
        _wait_for(target, health_pb2.HealthCheckResponse.SERVING, within=10)
        process.send_signal(signal.SIGTERM)
        _wait_for(target, health_pb2.HealthCheckResponse.NOT_SERVING, within=3)
        # Still answering calls while it drains.
        with grpc.insecure_channel(target) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                run_service_pb2_grpc.RunServiceStub(channel).GetRun(
                    run_service_pb2.GetRunRequest(run_id="run_x"), timeout=2
                )
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def test_migrate_applies_the_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    first = subprocess.run(
        [*COMMAND, "migrate", "--database-url", url], capture_output=True, text=True, check=True
    )
    again = subprocess.run(
        [*COMMAND, "migrate", "--database-url", url], capture_output=True, text=True, check=True
    )
    assert f"revision {HEAD_REVISION}" in first.stdout
    assert f"revision {HEAD_REVISION}" in again.stdout


@pytest.mark.parametrize(
    "arguments",
    [
        ["serve", "--listen", "10.1.2.3:5000"],
        ["serve", "--listen", "nonsense"],
        ["serve", "--listen", "unix://relative.sock"],
        ["serve", "--max-message-bytes", "10"],
        ["serve", "--database-url", "mysql://x/y"],
    ],
)
def test_bad_configuration_exits_with_a_message(tmp_path: Path, arguments: list[str]) -> None:
    result = subprocess.run(
        [*COMMAND, *arguments], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "invalid configuration" in result.stderr


def test_settings_come_from_file_then_environment_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(
        'database_url = "sqlite:///from-file.db"\nworker_threads = 3\nmax_message_bytes = 2097152\n'
    )
    monkeypatch.setenv("PSYCH_SIDECAR_WORKER_THREADS", "5")
    settings = load_settings(str(config), max_message_bytes=4 * 1024 * 1024)
    assert settings.database_url == "sqlite:///from-file.db"
    assert settings.worker_threads == 5
    assert settings.max_message_bytes == 4 * 1024 * 1024


def test_listen_addresses_parse() -> None:
    assert parse_listen_address("unix:///run/s.sock").unix_path == "/run/s.sock"
    assert parse_listen_address("127.0.0.1:5000").grpc_target == "127.0.0.1:5000"
    assert parse_listen_address("[::1]:7").grpc_target == "[::1]:7"
    assert parse_listen_address("[::1]:7").is_loopback
    assert not parse_listen_address("0.0.0.0:7").is_loopback


def test_a_health_only_listener_serves_health_and_nothing_else(tmp_path: Path) -> None:
    socket_path = tmp_path / "s.sock"
    health_address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PSYCH_SIDECAR_DRAIN_DELAY_SECONDS": "3"}
    process = subprocess.Popen(
        [
            *COMMAND,
            "serve",
            "--listen",
            f"unix://{socket_path}",
            "--health-listen",
            health_address,
            "--database-url",
            f"sqlite:///{tmp_path / 'db'}",
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(health_address, health_pb2.HealthCheckResponse.SERVING, within=10)
        probe = subprocess.run(
            [*COMMAND, "health", "--address", health_address], capture_output=True, text=True
        )
        assert probe.returncode == 0, probe.stderr
        assert "SERVING" in probe.stdout
        with grpc.insecure_channel(health_address) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                run_service_pb2_grpc.RunServiceStub(channel).GetRun(
                    run_service_pb2.GetRunRequest(run_id="run_x"), timeout=2
                )
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        process.send_signal(signal.SIGTERM)
        _wait_for(health_address, health_pb2.HealthCheckResponse.NOT_SERVING, within=3)
        draining = subprocess.run(
            [*COMMAND, "health", "--address", health_address], capture_output=True, text=True
        )
        assert draining.returncode == 1
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    nobody = subprocess.run(
        [*COMMAND, "health", "--address", f"unix://{socket_path}"], capture_output=True, text=True
    )
    assert nobody.returncode == 1

"""What `serve` imports before it answers health SERVING: only what the configured sidecar
uses. Each case runs the real command line in a fresh interpreter and lists the modules loaded
at the moment its health service first says SERVING."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.processes import free_port

# Runs `psych-sidecar serve` through the command's entry point in this interpreter's main
# thread; a thread watches its health (the call waits for the listener: reconnect attempts
# every 20 ms), prints the modules loaded at SERVING and whether the garbage collector is on,
# and stops the sidecar as SIGTERM would.
_PROBE = textwrap.dedent(
    """
    import gc, json, os, signal, sys, threading
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from psych_sidecar.launch import main

    target = sys.argv[1]
    RECONNECT = [
        ("grpc.initial_reconnect_backoff_ms", 20),
        ("grpc.min_reconnect_backoff_ms", 20),
        ("grpc.max_reconnect_backoff_ms", 20),
    ]

    def watch():
        with grpc.insecure_channel(target, options=RECONNECT) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            changes = stub.Watch(health_pb2.HealthCheckRequest(), wait_for_ready=True)
            for answer in changes:
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            changes.cancel()
        loaded = sorted(sys.modules)
        print("LOADED " + json.dumps(loaded), flush=True)
        print("GC " + json.dumps(gc.isenabled()), flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()
    sys.argv = ["psych-sidecar", "serve", "--listen", target, *sys.argv[2:]]
    sys.exit(main())
    """
)

# Imported only by the sidecars that need them: prometheus_client with the admin listener,
# cryptography with the first stored secret sealed or opened.
_ON_DEMAND = {
    "alembic",
    "mcp",
    "mcp_types",
    "opentelemetry",
    "psycopg",
    "prometheus_client",
    "cryptography",
}
# Modules of packages a start needs that a SQLite sidecar's serve does not: the PostgreSQL
# dialect, the inspect command's gRPC client, the Run inspector's use cases (the admin
# listener's /ui).
_ON_DEMAND_MODULES = {
    "sqlalchemy.dialects.postgresql",
    "psych_sidecar.inspect_command.remote",
    "psych_sidecar.domain.run_inspector",
}


def _at_serving(
    tmp_path: Path, *arguments: str, env: dict[str, str] | None = None
) -> tuple[set[str], bool]:
    """The modules loaded when health first says SERVING (their full names), and whether the
    garbage collector is on then."""
    target = f"127.0.0.1:{free_port()}"
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE, target, *arguments],
        env={**os.environ, **(env or {})},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    (loaded,) = [line.removeprefix("LOADED ") for line in lines if line.startswith("LOADED ")]
    (collecting,) = [line.removeprefix("GC ") for line in lines if line.startswith("GC ")]
    return set(json.loads(loaded)), json.loads(collecting)


def _packages(modules: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


@pytest.fixture
def current_database(tmp_path: Path) -> str:
    """A SQLite database already at this version's schema."""
    url = f"sqlite:///{tmp_path / 'current.db'}"
    subprocess.run(
        [sys.executable, "-m", "psych_sidecar", "migrate", "--database-url", url],
        cwd=tmp_path,
        capture_output=True,
        check=True,
        timeout=120,
    )
    return url


def test_serve_on_a_current_schema_imports_no_migrations_mcp_sdk_or_tracing(
    tmp_path: Path, current_database: str
) -> None:
    modules, collecting = _at_serving(tmp_path, "--database-url", current_database)
    loaded = _packages(modules)
    assert "psych_sidecar" in loaded
    assert not loaded & _ON_DEMAND
    assert not modules & _ON_DEMAND_MODULES
    # Off while the modules loaded, on again once serving.
    assert collecting


def test_serve_with_keyword_search_imports_no_numpy_before_a_search(
    tmp_path: Path, current_database: str
) -> None:
    # With semantic search on, the model (and numpy) loads on its own thread as soon as the
    # sidecar serves; with it off, numpy comes with the first search index only.
    modules, _ = _at_serving(
        tmp_path, "--database-url", current_database, "--semantic-search", "off"
    )
    loaded = _packages(modules)
    assert "psych_sidecar" in loaded
    assert not loaded & {*_ON_DEMAND, "numpy", "snowballstemmer", "tokenizers"}


def test_serve_imports_migrations_tracing_and_metrics_when_they_are_needed(
    tmp_path: Path,
) -> None:
    # A fresh database has migrations to apply; traces are made (and dropped by the exporter);
    # the admin listener serves /metrics.
    modules, _ = _at_serving(
        tmp_path,
        "--database-url",
        f"sqlite:///{tmp_path / 'fresh.db'}",
        "--tracing",
        "otlp",
        "--admin-listen",
        "127.0.0.1:0",
        env={"OTEL_TRACES_EXPORTER": "none"},
    )
    loaded = _packages(modules)
    assert {"alembic", "opentelemetry", "prometheus_client"} <= loaded
    assert not loaded & {"mcp", "mcp_types", "psycopg"}

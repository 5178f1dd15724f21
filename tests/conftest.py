"""Fixtures: the real grpc.aio sidecar on real sockets over real databases.

The pytest-grpc plugin supplies grpc_channel/grpc_stub; its grpc_server fixture is
overridden here to start the real sidecar (its own fixture builds a synchronous
grpc.server with our servicers, which would not be the server we ship).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import hypothesis
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sqlalchemy import create_engine, text

from psych.sidecar.v1 import (
    connection_service_pb2_grpc,
    run_service_pb2_grpc,
    spec_service_pb2_grpc,
    tool_service_pb2_grpc,
    turn_service_pb2_grpc,
)
from psych_sidecar.api.server import Sidecar
from psych_sidecar.config import Settings

POSTGRES_URL_ENV = "PSYCH_TEST_POSTGRES_URL"

# CI explores the same examples on every run, so a red build is always reproducible; developers'
# runs keep exploring new ones.
hypothesis.settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    hypothesis.settings.load_profile("ci")
UNLIMITED_CHANNEL = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]


def postgres_admin_url() -> str:
    url = os.environ.get(POSTGRES_URL_ENV)
    if not url:
        pytest.fail(
            f"{POSTGRES_URL_ENV} is not set: run the tests with scripts/test, which starts a "
            "throwaway PostgreSQL (scripts/with-postgres)"
        )
    return url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A fresh, empty database per test module, on each backend the sidecar supports."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'sidecar.db'}"
        return
    with postgres_database() as url:
        yield url


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A new, empty database on the test PostgreSQL server, dropped afterwards."""
    admin_url = postgres_admin_url()
    name = "t_" + uuid.uuid4().hex[:12]
    # pre-ping: a test may restart the server (test_storage_faults) under a pooled connection.
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    base, _, _ = admin_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def sidecar_overrides() -> dict[str, Any]:
    """Settings a test module changes for its sidecar; override in the module."""
    return {}


class RunningSidecar:
    """A Sidecar serving on its own event loop in a background thread."""

    def __init__(self, settings: Settings, **options: Any) -> None:
        self.settings = settings
        self.sidecar = Sidecar(settings, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the sidecar serves on, for running coroutines against its objects."""
        return self._loop

    def __enter__(self) -> RunningSidecar:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.sidecar.start(), self._loop).result(60)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.sidecar.stop(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture(scope="module", params=["unix", "tcp"])
def grpc_addr(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where the sidecar listens: a Unix socket or loopback TCP, as hosts use it."""
    if request.param == "unix":
        return f"unix:{tmp_path_factory.mktemp('sock') / 's.sock'}"
    return "127.0.0.1:0"


@pytest.fixture(scope="module")
def grpc_server(
    grpc_addr: str,
    database_url: str,
    sidecar_overrides: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningSidecar]:
    """Overrides pytest-grpc's fixture: the real sidecar, real socket, real database."""
    listen = (
        f"unix://{grpc_addr.removeprefix('unix:')}" if grpc_addr.startswith("unix:") else grpc_addr
    )
    settings = Settings(
        listen=[listen],
        database_url=database_url,
        data_dir=tmp_path_factory.mktemp("data"),
        shutdown_grace_seconds=5,
        **sidecar_overrides,
    )
    with RunningSidecar(settings) as running:
        yield running


@pytest.fixture(scope="module")
def grpc_channel(grpc_server: RunningSidecar) -> Iterator[grpc.Channel]:
    """Overrides pytest-grpc's channel: to the address actually bound (TCP port 0 resolved),
    with no client-side size limit so the server's limits are what is tested."""
    with grpc.insecure_channel(grpc_server.sidecar.bound[0], options=UNLIMITED_CHANNEL) as channel:
        yield channel


@dataclass
class Stubs:
    specs: spec_service_pb2_grpc.SpecServiceStub
    runs: run_service_pb2_grpc.RunServiceStub
    turns: turn_service_pb2_grpc.TurnServiceStub
    tools: tool_service_pb2_grpc.ToolServiceStub
    connections: connection_service_pb2_grpc.ConnectionServiceStub


@pytest.fixture(scope="module")
def stubs(grpc_channel: grpc.Channel) -> Stubs:
    """One generated stub per service, on pytest-grpc's channel."""
    return Stubs(
        specs=spec_service_pb2_grpc.SpecServiceStub(grpc_channel),
        runs=run_service_pb2_grpc.RunServiceStub(grpc_channel),
        turns=turn_service_pb2_grpc.TurnServiceStub(grpc_channel),
        tools=tool_service_pb2_grpc.ToolServiceStub(grpc_channel),
        connections=connection_service_pb2_grpc.ConnectionServiceStub(grpc_channel),
    )


@dataclass
class RpcFailure:
    code: grpc.StatusCode
    message: str
    info: error_details_pb2.ErrorInfo
    detail_count: int


def rpc_failure(call: Callable[[], object]) -> RpcFailure:
    """Run a call that must fail and return its status and its single ErrorInfo."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error: Any = caught.value
    status = rpc_status.from_call(error)
    assert status is not None, f"no google.rpc.Status on {error.code()}: {error.details()}"
    infos = []
    for detail in status.details:
        # Besides its ErrorInfo, a retryable error may carry a google.rpc.RetryInfo.
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            continue
        info = error_details_pb2.ErrorInfo()
        assert detail.Unpack(info)
        infos.append(info)
    assert len(infos) == 1
    assert infos[0].domain == "psych.sidecar.v1"
    return RpcFailure(error.code(), status.message, infos[0], len(status.details))


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique names, so tests sharing a module's database never collide."""
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:10]}"

"""Fixtures: the real grpc.aio sidecar on real sockets over real databases.

The pytest-grpc plugin supplies grpc_channel/grpc_stub; its grpc_server fixture is
overridden here to start the real sidecar (its own fixture builds a synchronous
grpc.server with our servicers, which would not be the server we ship).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import hypothesis
import pytest

from psych.sidecar.v1 import connection_service_pb2
from tests.support.connections import listed
from tests.support.databases import TEST_SECRET_KEY, database_of_kind, pooling_of
from tests.support.host import Host
from tests.support.settings import flat_settings
from tests.support.sidecar import UNLIMITED_CHANNEL, RunningSidecar, Stubs

# CI explores the same examples on every run, so a red build is always reproducible; developers'
# runs keep exploring new ones.
hypothesis.settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    hypothesis.settings.load_profile("ci")


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module runs its sidecar on fewer databases or transports than every one with
    SIDECAR_DATABASES or SIDECAR_TRANSPORTS (a comment beside it says why that is enough): its
    tests are parametrized with those, which take precedence over the fixtures' own params."""
    for fixture, narrowed in (
        ("database_url", getattr(metafunc.module, "SIDECAR_DATABASES", None)),
        ("grpc_addr", getattr(metafunc.module, "SIDECAR_TRANSPORTS", None)),
    ):
        if narrowed is not None and fixture in metafunc.fixturenames:
            metafunc.definition.add_marker(
                pytest.mark.parametrize(fixture, narrowed, indirect=True, scope="module")
            )


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A fresh, empty database per test module, on each backend the sidecar supports (and,
    for a module that asks for it in SIDECAR_DATABASES, PostgreSQL through PgBouncer)."""
    with database_of_kind(request.param, tmp_path_factory.mktemp("sqlite")) as url:
        yield url


@pytest.fixture(scope="module")
def sidecar_overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Settings a test module changes for its sidecar: its module-level SIDECAR_OVERRIDES
    (a module whose settings need another fixture, a temporary path, overrides this one)."""
    return dict(getattr(request.module, "SIDECAR_OVERRIDES", {}))


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
    settings = flat_settings(
        listen=[listen],
        database_url=database_url,
        database_pooling=pooling_of(database_url),
        data_dir=tmp_path_factory.mktemp("data"),
        shutdown_grace_seconds=5,
        secret_keys=TEST_SECRET_KEY,
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


@pytest.fixture(scope="module")
def stubs(grpc_channel: grpc.Channel) -> Stubs:
    """One generated stub per service, on pytest-grpc's channel."""
    return Stubs.on(grpc_channel)


@pytest.fixture
def host(stubs: Stubs, unique: Callable[[str], str]) -> Host:
    """A host of a fresh tenant, so tests sharing a module's sidecar never see each other."""
    return Host(stubs, unique("tenant"))


@pytest.fixture
def tenant(unique: Callable[[str], str], stubs: Stubs) -> Iterator[str]:
    """A fresh tenant whose connections are deleted after the test, so that no session
    outlives it."""
    name = unique("tenant")
    yield name
    for connection in listed(stubs, name):
        stubs.connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant=name, name=connection)
        )


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique names, so tests sharing a module's database never collide."""
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:10]}"

"""The admin HTTP listener: off by default, on its own address, started and stopped with
the sidecar, serving /metrics."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["content-type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["content-type"], error.read().decode()


# An admin listener on a free loopback port.
SIDECAR_OVERRIDES: dict[str, Any] = {"admin_listen": ["127.0.0.1:0"]}


def test_metrics_are_served_on_the_admin_listener(grpc_server: RunningSidecar) -> None:
    admin = grpc_server.sidecar.admin
    assert admin is not None
    [url] = admin.bound
    assert url.startswith("http://127.0.0.1:")
    status, content_type, body = get(url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    assert "# TYPE psych_sidecar_rpc_seconds histogram" in body
    assert "# TYPE psych_sidecar_connection_state gauge" in body
    status, _, _ = get(url + "/nothing-here")
    assert status == 404


def test_the_admin_listener_is_off_by_default(tmp_path: Any) -> None:

    settings = flat_settings(
        listen=["127.0.0.1:0"],
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        data_dir=tmp_path,
    )
    with RunningSidecar(settings) as running:
        assert running.sidecar.admin is None


def test_the_admin_listener_stops_with_the_sidecar(tmp_path: Any) -> None:

    settings = flat_settings(
        listen=["127.0.0.1:0"],
        admin_listen=["127.0.0.1:0"],
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        data_dir=tmp_path,
    )
    with RunningSidecar(settings) as running:
        assert running.sidecar.admin is not None
        [url] = running.sidecar.admin.bound
        assert get(url + "/metrics")[0] == 200
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/metrics", timeout=5)


def test_an_admin_unix_socket_gets_the_api_sockets_policy(tmp_path: Any) -> None:
    """Its mode is unix_socket_mode; a live socket is refused, never taken over; a stale one
    (nobody accepting) is replaced."""
    import asyncio
    import socket
    import stat

    from psych_sidecar.app.sidecar import Sidecar
    from psych_sidecar.listeners import StartupError, check_listeners

    admin_path = tmp_path / "admin.sock"
    settings = flat_settings(
        listen=["127.0.0.1:0"],
        admin_listen=[f"unix://{admin_path}"],
        unix_socket_mode=0o600,
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        data_dir=tmp_path,
    )
    with RunningSidecar(settings):
        assert stat.S_IMODE(admin_path.stat().st_mode) == 0o600
    assert not admin_path.exists()

    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(admin_path))
    live.listen(1)
    try:
        with pytest.raises(StartupError, match="already serving"):
            check_listeners(settings)
        with pytest.raises(StartupError, match="already serving"):
            asyncio.run(_start_and_stop(Sidecar(settings)))
        assert stat.S_ISSOCK(admin_path.stat().st_mode)
    finally:
        live.close()
    # Closed, its file stays: stale, so the next start takes the address.
    with RunningSidecar(settings):
        assert stat.S_IMODE(admin_path.stat().st_mode) == 0o600


async def _start_and_stop(sidecar: Any) -> None:
    try:
        await sidecar.start()
    finally:
        await sidecar.stop()

"""The admin HTTP listener: off by default, on its own address, started and stopped with
the sidecar, serving /metrics."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import pytest

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
    from psych_sidecar.config import Settings

    settings = Settings(
        listen=["127.0.0.1:0"],
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        data_dir=tmp_path,
    )
    with RunningSidecar(settings) as running:
        assert running.sidecar.admin is None


def test_the_admin_listener_stops_with_the_sidecar(tmp_path: Any) -> None:
    from psych_sidecar.config import Settings

    settings = Settings(
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

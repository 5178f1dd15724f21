"""deploy/ agrees with the sidecar it deploys: its settings load, its probes and volumes match."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from psych_sidecar.config import load_settings

DEPLOY = Path(__file__).parent.parent / "deploy"
OVERLAYS = sorted(path.name for path in (DEPLOY / "overlays").iterdir())


def _render(overlay: str) -> list[dict[str, Any]]:
    output = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [document for document in yaml.safe_load_all(output) if document]


def _sidecar(documents: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["initContainers"] if c["name"] == "psych-sidecar")
    return pod, sidecar


def test_the_config_file_is_valid_sidecar_settings() -> None:
    settings = load_settings(str(DEPLOY / "base" / "sidecar.toml"))
    assert settings.listen_addresses()[0].unix_path == "/run/psych/sidecar.sock"
    assert settings.listeners.unix_socket_mode == 0o660


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_matches_the_sidecar_settings(overlay: str) -> None:
    settings = load_settings(str(DEPLOY / "base" / "sidecar.toml"))
    pod, sidecar = _sidecar(_render(overlay))
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar
    health_port = settings.health_listen_addresses()[0].port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[probe]["grpc"]["port"] == health_port
    drain = settings.listeners.drain_delay_seconds + settings.listeners.shutdown_grace_seconds
    assert pod["terminationGracePeriodSeconds"] > drain
    socket_dir = str(Path(settings.listen_addresses()[0].unix_path or "").parent)
    for container in [sidecar, *pod["containers"]]:
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["psych-socket"] == socket_dir
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["capabilities"]["drop"] == ["ALL"]
        assert security["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e for e in sidecar["env"]}
    assert "PSYCH_SIDECAR_DATABASE_URL" in env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_finds_the_admin_listener(overlay: str) -> None:
    settings = load_settings(str(DEPLOY / "base" / "sidecar.toml"))
    [admin] = settings.admin_listen_addresses()
    documents = _render(overlay)
    _pod, sidecar = _sidecar(documents)
    ports = {port["name"]: port["containerPort"] for port in sidecar["ports"]}
    assert ports["metrics"] == admin.port
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(admin.port)
    assert annotations["prometheus.io/path"] == "/metrics"
    monitor = yaml.safe_load((DEPLOY / "monitoring" / "podmonitor.yaml").read_text())
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_pod_check_plays_the_sqlite_overlay_with_only_podmans_changes() -> None:
    """tests/pod (scripts/check-pod) changes the images, makes the native sidecar the first
    container (no probes on init containers in podman) and drops the container ports (podman
    4.3 publishes them on the host); everything else is deploy/overlays/sqlite as rendered."""
    output = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY.parent / "tests" / "pod")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    played = [document for document in yaml.safe_load_all(output) if document]
    expected = _render("sqlite")
    deployment = next(d for d in expected if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    sidecar = pod.pop("initContainers")[0]
    del sidecar["restartPolicy"], sidecar["ports"]
    sidecar["image"] = "localhost/psych-sidecar:check"
    pod["containers"][0]["image"] = "localhost/psych-pod-host:check"
    pod["containers"].insert(0, sidecar)
    assert played == expected

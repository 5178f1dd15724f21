"""The psych-sidecar command as an operator runs it: a real process, real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import grpc
import pytest
from grpc_health.v1 import health_pb2
from sqlalchemy import create_engine, make_url, text

from psych.sidecar.v1 import run_service_pb2, run_service_pb2_grpc
from psych_sidecar import __version__, cli
from psych_sidecar.bulk import heap
from psych_sidecar.config import (
    ENV_PREFIX,
    SETTING_KEYS,
    Settings,
    load_settings,
    parse_listen_address,
)
from psych_sidecar.storage.migrate import schema_name
from tests.support.databases import HEAD_REVISION, postgres_admin_url, postgres_database
from tests.support.polling import wait_for
from tests.support.processes import COMMAND, ServedSidecar, free_port, health_status, served


def test_version_prints_the_package_version() -> None:
    output = subprocess.run([*COMMAND, "version"], capture_output=True, text=True, check=True)
    assert output.stdout.strip() == __version__


def test_serve_with_defaults_is_serving_on_a_unix_socket_and_sqlite_file(tmp_path: Path) -> None:
    socket_path = tmp_path / "psych-sidecar-data" / "sidecar.sock"
    with served(health=f"unix:{socket_path}", cwd=tmp_path):
        assert (tmp_path / "psych-sidecar-data" / "sidecar.db").exists()
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o660
    assert not socket_path.exists()


def _drains(target: str) -> None:
    """SIGTERM was sent: `target` reports NOT_SERVING within the drain delay (3 s here)."""
    wait_for(
        lambda: health_status(target) == health_pb2.HealthCheckResponse.NOT_SERVING,
        f"{target} to report NOT_SERVING",
        within=3,
    )


def test_sigterm_reports_not_serving_then_exits(tmp_path: Path) -> None:
    target = f"unix://{tmp_path / 's.sock'}"
    with served(
        "--listen",
        target,
        "--database-url",
        f"sqlite:///{tmp_path / 'db'}",
        env={"PSYCH_SIDECAR_DRAIN_DELAY_SECONDS": "3"},
    ) as sidecar:
        sidecar.process.send_signal(signal.SIGTERM)
        _drains(target)
        # Still answering calls while it drains.
        with grpc.insecure_channel(target) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                run_service_pb2_grpc.RunServiceStub(channel).GetRun(
                    run_service_pb2.GetRunRequest(run_id="run_x"), timeout=2
                )
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert sidecar.exit_status() == 0


def test_migrate_applies_the_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    first = subprocess.run(
        [*COMMAND, "migrate", "--database-url", url], capture_output=True, text=True, check=True
    )
    again = subprocess.run(
        [*COMMAND, "migrate", "--database-url", url], capture_output=True, text=True, check=True
    )
    # The schema is named by the migration file that made it, not by alembic's revision id.
    assert first.stdout.strip() == f"database at schema {schema_name(HEAD_REVISION)}"
    assert again.stdout.strip() == first.stdout.strip()
    assert schema_name(HEAD_REVISION) == "0016_tool_input_rounds"
    # Operators see each migration by its file's name, never alembic's revision ids.
    applied = re.findall(r"applied schema migration (\w+): ", first.stderr)
    migrations = Path(cli.__file__).parent / "storage" / "migrations" / "versions"
    assert applied == sorted(path.stem for path in migrations.glob("[0-9]*.py"))
    assert "Running upgrade" not in first.stderr
    assert "applied schema migration" not in again.stderr


@pytest.mark.parametrize(
    "arguments",
    [
        ["serve", "--listen", "10.1.2.3:5000"],
        ["serve", "--listen", "nonsense"],
        ["serve", "--listen", "unix://relative.sock"],
        ["serve", "--max-message-bytes", "10"],
        ["serve", "--database-url", "mysql://x/y"],
        ["serve", "--database-url", "nonsense"],
        ["serve", "--log-level", "LOUD"],
        ["serve", "--config", "missing.toml"],
        ["serve", "--config", "broken.toml"],
        ["serve", "--config", "unknown-key.toml"],
        ["migrate", "--worker-threads", "0"],
        ["health", "--listen", "nonsense"],
    ],
)
def test_bad_configuration_exits_with_a_message(tmp_path: Path, arguments: list[str]) -> None:
    (tmp_path / "broken.toml").write_text("listen = [\n")
    (tmp_path / "unknown-key.toml").write_text("listen_on = []\n")
    result = subprocess.run(
        [*COMMAND, *arguments], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "invalid configuration" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_settings_come_from_file_then_environment_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(
        'database_url = "sqlite:///from-file.db"\nworker_threads = 3\nmax_message_bytes = 2097152\n'
    )
    monkeypatch.setenv("PSYCH_SIDECAR_WORKER_THREADS", "5")
    settings = load_settings(str(config), max_message_bytes=4 * 1024 * 1024)
    assert settings.storage.database_url == "sqlite:///from-file.db"
    assert settings.storage.worker_threads == 5
    assert settings.listeners.max_message_bytes == 4 * 1024 * 1024


def test_listen_addresses_parse() -> None:
    assert parse_listen_address("unix:///run/s.sock").unix_path == "/run/s.sock"
    assert parse_listen_address("127.0.0.1:5000").grpc_target == "127.0.0.1:5000"
    assert parse_listen_address("[::1]:7").grpc_target == "[::1]:7"
    assert parse_listen_address("[::1]:7").is_loopback
    assert not parse_listen_address("0.0.0.0:7").is_loopback


def test_a_health_only_listener_serves_health_and_nothing_else(tmp_path: Path) -> None:
    socket_path = tmp_path / "s.sock"
    health_address = f"127.0.0.1:{free_port()}"
    with served(
        "--listen",
        f"unix://{socket_path}",
        "--health-listen",
        health_address,
        "--database-url",
        f"sqlite:///{tmp_path / 'db'}",
        health=health_address,
        env={"PSYCH_SIDECAR_DRAIN_DELAY_SECONDS": "3"},
    ) as sidecar:
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
        sidecar.process.send_signal(signal.SIGTERM)
        _drains(health_address)
        draining = subprocess.run(
            [*COMMAND, "health", "--address", health_address], capture_output=True, text=True
        )
        assert draining.returncode == 1
        assert sidecar.exit_status() == 0
    nobody = subprocess.run(
        [*COMMAND, "health", "--address", f"unix://{socket_path}"], capture_output=True, text=True
    )
    assert nobody.returncode == 1


# Every setting reads the same from a flag, the environment and the file ---------------------

# A value other than the default for each kind of setting; a setting whose type alone does
# not say what is valid gets its own.
_SAMPLES: dict[str, Any] = {
    "database_url": "sqlite:///elsewhere.db",
    "migration_database_url": "sqlite:///migrated.db",
    "log_level": "DEBUG",
    "mcp_commands": {"time": {"argv": ["mcp-server-time"], "allow_extra_args": True}},
    "tls_cert_file": "/tmp/cert.pem",
    "tls_key_file": "/tmp/key.pem",
    "tls_client_ca_file": "/tmp/ca.pem",
    "secret_keys": "c2FtcGxlLWtleS1zYW1wbGUta2V5LXNhbXBsZS1rZXk=,b3RoZXI=",
    "secret_key_file": "/tmp/keys",
    "search_model_cache_dir": "/tmp/search-model",
    "oauth_allowed_networks": ["10.20.0.0/16", "fd00::/8"],
    "tracing_sample_ratio": 0.5,
}
# Settings valid only together with others: those are set the same way beside them.
_COMPANIONS: dict[str, dict[str, Any]] = {
    "tls_cert_file": {"tls_key_file": "/tmp/key.pem"},
    "tls_key_file": {"tls_cert_file": "/tmp/cert.pem"},
    "tls_client_ca_file": {"tls_cert_file": "/tmp/cert.pem", "tls_key_file": "/tmp/key.pem"},
}


def _sample(name: str) -> Any:
    field = SETTING_KEYS[name].field
    if name in _SAMPLES:
        return _SAMPLES[name]
    kind = get_origin(field.annotation) or field.annotation
    if kind is bool:
        return not field.default
    if kind in (int, float):
        return field.default + 1
    if kind is list:
        return ["unix:///tmp/one.sock", "127.0.0.1:50051"]
    if kind is Literal:
        return next(value for value in get_args(field.annotation) if value != field.default)
    if kind is Path:
        return "/tmp/elsewhere"
    raise AssertionError(f"add a sample value for the setting {name} to _SAMPLES")


def _as_flags(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag.removeprefix("--")]
    if isinstance(value, list):
        return [argument for item in value for argument in (flag, str(item))]
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def _as_environment(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


@pytest.mark.parametrize("name", list(SETTING_KEYS))
@pytest.mark.parametrize("command", ["serve", "migrate", "health"])
def test_every_setting_is_a_flag_an_environment_variable_and_a_file_key(
    name: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in os.environ:
        if variable.startswith(ENV_PREFIX):
            monkeypatch.delenv(variable)
    values = {name: _sample(name), **_COMPANIONS.get(name, {})}
    setting = SETTING_KEYS[name]
    default = setting.value(Settings())

    flags = [flag for key, value in values.items() for flag in _as_flags(key, value)]
    from_flags = cli.settings_from_arguments([command, *flags])

    config = tmp_path / "sidecar.toml"
    # TOML and JSON agree on strings, numbers, true/false, lists and inline tables of them.
    config.write_text(
        "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items()).replace(
            '": ', '" = '
        )
    )
    from_file = cli.settings_from_arguments([command, "--config", str(config)])

    for key, value in values.items():
        monkeypatch.setenv(ENV_PREFIX + key.upper(), _as_environment(value))
    from_environment = cli.settings_from_arguments([command])

    assert setting.value(from_flags) != default
    assert setting.value(from_flags) == setting.value(from_environment)
    assert setting.value(from_flags) == setting.value(from_file)


def test_a_flag_beats_the_environment_which_beats_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text("worker_threads = 3\ncatalog_ttl_seconds = 7\nallow_non_loopback = true\n")
    monkeypatch.setenv("PSYCH_SIDECAR_WORKER_THREADS", "5")
    monkeypatch.setenv("PSYCH_SIDECAR_CATALOG_TTL_SECONDS", "9")
    settings = cli.settings_from_arguments(
        ["serve", "--config", str(config), "--catalog-ttl-seconds", "11", "--no-allow-non-loopback"]
    )
    assert settings.storage.worker_threads == 5
    assert settings.mcp.catalog_ttl_seconds == 11
    assert settings.listeners.allow_non_loopback is False


def test_flat_keys_land_in_their_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings are grouped by concern in code; the file's keys and the environment's names stay
    the flat ones existing configurations use, and the environment still beats the file within a
    group."""
    for variable in os.environ:
        if variable.startswith(ENV_PREFIX):
            monkeypatch.delenv(variable)
    config = tmp_path / "sidecar.toml"
    config.write_text(
        "mcp_connect_timeout_seconds = 7\n"
        "catalog_ttl_seconds = 8\n"
        'admin_listen = ["127.0.0.1:9100"]\n'
        "resolution_cache_bytes = 2097152\n"
    )
    monkeypatch.setenv("PSYCH_SIDECAR_CATALOG_TTL_SECONDS", "9")
    monkeypatch.setenv("PSYCH_SIDECAR_ADMIN_UI_ALLOW_REMOTE", "true")
    settings = load_settings(str(config))
    assert settings.mcp.connect_timeout_seconds == 7
    assert settings.mcp.catalog_ttl_seconds == 9
    assert settings.admin.listen == ["127.0.0.1:9100"]
    assert settings.admin.ui_allow_remote is True
    assert settings.prompt.resolution_cache_bytes == 2 * 1024 * 1024


def test_an_invalid_setting_is_named_by_its_flat_key(tmp_path: Path) -> None:
    result = subprocess.run(
        [*COMMAND, "serve", "--mcp-connect-timeout-seconds", "-1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(
        "psych-sidecar: invalid configuration: mcp_connect_timeout_seconds: "
    ), result.stderr


def test_listen_flags_keep_their_spellings() -> None:
    settings = cli.settings_from_arguments(
        [
            "serve",
            "--listen",
            "[::1]:7",
            "--listen=unix:///run/a.sock",
            "--health-listen",
            "0.0.0.0:8",
            "--allow-non-loopback",
            "--unix-socket-mode",
            "0o600",
        ]
    )
    assert settings.listeners.listen == ["[::1]:7", "unix:///run/a.sock"]
    assert settings.listeners.health_listen == ["0.0.0.0:8"]
    assert settings.listeners.allow_non_loopback is True
    assert settings.listeners.unix_socket_mode == 0o600


def test_operations_doc_lists_every_setting_once() -> None:
    text = (Path(__file__).parent.parent / "docs" / "operations.md").read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| `([a-z_.]+)` \| ([^|]+) \|", section, flags=re.MULTILINE)
    assert sorted(key for key, _, _ in rows) == sorted(SETTING_KEYS)
    for key, where, default in rows:
        setting = SETTING_KEYS[key]
        assert where == ".".join(filter(None, [setting.group, setting.attribute])), key
        value = setting.field.get_default(call_default_factory=True)
        if isinstance(value, bool):
            spelled = {"true" if value else "false"}
        elif isinstance(value, int):
            spelled = {str(value), oct(value)}
        elif isinstance(value, float):
            spelled = {f"{value:g}"}
        elif isinstance(value, str | Path) and str(value):
            spelled = {str(value)}
        else:
            continue  # empty: the cell says what stands in for it (the socket, the SQLite file)
        assert default.split("`")[1] in spelled, (key, default)
    help_text = subprocess.run(
        [*COMMAND, "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name in SETTING_KEYS:
        assert "--" + name.replace("_", "-") in help_text
        assert ENV_PREFIX + name.upper() in help_text


# Expected start-up failures: one line, no traceback -----------------------------------------


def _failure(sidecar: ServedSidecar, *, only_line: bool = True) -> str:
    """The one line an expected start-up failure prints (after the start-up log, if
    `only_line` is false), exit status 1 and no traceback."""
    status = sidecar.exit_status()
    assert status == 1, sidecar.log
    assert "Traceback" not in sidecar.log, sidecar.log
    lines = sidecar.log.strip().splitlines()
    if only_line:
        assert len(lines) == 1, sidecar.log
    assert lines[-1].startswith("psych-sidecar: "), sidecar.log
    return lines[-1]


def test_a_second_sidecar_on_a_live_socket_says_so_in_one_line_and_exits_1(
    tmp_path: Path,
) -> None:
    socket_path = tmp_path / "s.sock"
    listen = f"unix://{socket_path}"
    with served("--listen", listen, "--data-dir", str(tmp_path / "one")) as first:
        line = _failure(ServedSidecar("--listen", listen, "--data-dir", str(tmp_path / "two")))
        assert "another sidecar is already serving on" in line
        assert str(socket_path) in line
        # The second one neither migrated a database nor touched the first one's socket.
        assert not (tmp_path / "two").exists()
        assert health_status(listen) == health_pb2.HealthCheckResponse.SERVING
    assert "Traceback" not in first.log


def test_a_stale_socket_of_a_crashed_sidecar_is_reclaimed(tmp_path: Path) -> None:
    socket_path = tmp_path / "psych-sidecar-data" / "sidecar.sock"
    crashed = ServedSidecar(health=f"unix:{socket_path}", cwd=tmp_path)
    crashed.wait_serving()
    crashed.kill()
    assert stat.S_ISSOCK(socket_path.stat().st_mode)  # left behind

    with served(health=f"unix:{socket_path}", cwd=tmp_path) as again:
        # `health` finds it through the same settings (here: the default data_dir).
        probe = subprocess.run(
            [*COMMAND, "health", "--data-dir", str(tmp_path / "psych-sidecar-data")],
            capture_output=True,
            text=True,
        )
        assert probe.returncode == 0, probe.stderr
    assert "removed the stale socket file" in again.log


def test_a_tcp_port_in_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _failure(ServedSidecar("--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path)))
    assert f"cannot listen on 127.0.0.1:{port}" in line
    assert not (tmp_path / "sidecar.db").exists()


def test_a_second_sidecar_on_a_live_tcp_port_does_not_share_it(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    with served("--listen", address, "--data-dir", str(tmp_path / "one")):
        line = _failure(ServedSidecar("--listen", address, "--data-dir", str(tmp_path / "two")))
        assert f"cannot listen on {address}" in line


def test_an_unreachable_database_is_one_line_and_exit_1(tmp_path: Path) -> None:
    url = f"postgresql://psych:s3cret@127.0.0.1:{free_port()}/psych"
    # After the start-up log, which says which tool search is in force.
    line = _failure(
        ServedSidecar("--database-url", url, "--data-dir", str(tmp_path)), only_line=False
    )
    assert "cannot use the database postgresql+psycopg://psych:***@127.0.0.1" in line
    assert "s3cret" not in line
    migrate = subprocess.run(
        [*COMMAND, "migrate", "--database-url", url], capture_output=True, text=True, timeout=60
    )
    assert migrate.returncode == 1
    assert "Traceback" not in migrate.stderr
    assert len(migrate.stderr.strip().splitlines()) == 1, migrate.stderr


def test_a_postgresql_role_without_temporary_tables_is_refused_at_start(tmp_path: Path) -> None:
    # Values over 1 MiB are written through a temporary table (storage/bulk_values.py): a role
    # that may not create one is told at start, not by the first large tool result.
    role = "r_" + uuid.uuid4().hex[:10]
    admin = create_engine(postgres_admin_url(), isolation_level="AUTOCOMMIT")
    try:
        with postgres_database() as url:
            database = make_url(url).database
            with admin.connect() as connection:
                connection.execute(text(f'CREATE ROLE "{role}" LOGIN'))
                connection.execute(text(f'ALTER DATABASE "{database}" OWNER TO "{role}"'))
                connection.execute(
                    text(f'REVOKE TEMPORARY ON DATABASE "{database}" FROM PUBLIC, "{role}"')
                )
            as_role = make_url(url).set(username=role).render_as_string(hide_password=False)
            line = _failure(
                ServedSidecar("--database-url", as_role, "--data-dir", str(tmp_path)),
                only_line=False,
            )
            assert "may not create temporary tables" in line
            assert "GRANT TEMPORARY" in line
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


def test_bad_configuration_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [*COMMAND, "serve", "--max-message-bytes", "10", "--worker-threads", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "max_message_bytes" in lines[0]
    assert "worker_threads" in lines[0]


def test_serve_tunes_glibc_malloc_to_reuse_large_buffers() -> None:
    # This machine's C library is glibc (Debian); a value of 0 leaves malloc alone.
    libc = os.confstr("CS_GNU_LIBC_VERSION")
    assert libc is not None
    assert libc.startswith("glibc")
    assert heap.reuse_large_blocks(Settings().process.large_buffer_reuse_bytes) is True
    assert heap.reuse_large_blocks(0) is False

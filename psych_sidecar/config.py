"""Configuration: defaults < optional TOML file < environment (PSYCH_SIDECAR_*) < CLI flags."""

from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

ENV_PREFIX = "PSYCH_SIDECAR_"
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG_FILE"
DEFAULT_DATA_DIR = Path("psych-sidecar-data")
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """A parsed --listen value: a Unix socket path, or a TCP host and port."""

    unix_path: str | None = None
    host: str = ""
    port: int = 0

    @property
    def grpc_target(self) -> str:
        if self.unix_path is not None:
            return f"unix:{self.unix_path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        if self.unix_path is not None or self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_listen_address(value: str) -> ListenAddress:
    """`unix:///absolute/path`, `unix:relative/path` or `HOST:PORT` (`[::1]:PORT` for IPv6)."""
    if value.startswith("unix://"):
        path = value.removeprefix("unix://")
        if not path.startswith("/"):
            raise ValueError(f"{value!r}: unix:// needs an absolute path (unix:///run/x.sock)")
        return ListenAddress(unix_path=path)
    if value.startswith("unix:"):
        return ListenAddress(unix_path=value.removeprefix("unix:"))
    host, separator, port = value.rpartition(":")
    if not separator or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{value!r} is neither unix:///path nor HOST:PORT")
    return ListenAddress(host=host.strip("[]"), port=int(port))


class StdioCommand(BaseModel):
    """A command the operator allows stdio connections to start. The API can only name it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    argv: list[str] = Field(min_length=1, description="The program and its fixed arguments.")
    allow_extra_args: bool = Field(
        default=False, description="Whether a connection may append its own arguments."
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment set for the process; a connection's env is merged over it.",
    )
    allowed_env: list[str] = Field(
        default_factory=list,
        description=(
            "The environment names a connection may set for this command: exact names, or a "
            "prefix ending in '*' (GITHUB_*). Loader and interpreter variables (LD_*, "
            "PYTHON*, NODE_OPTIONS, PATH, ...) pass only when named exactly. Empty: none."
        ),
    )

    @field_validator("allowed_env")
    @classmethod
    def _valid_env_names(cls, values: list[str]) -> list[str]:
        for value in values:
            name = value.removesuffix("*")
            if not name or "*" in name or "=" in name or "\x00" in name:
                raise ValueError(f"{value!r}: an env name, or a prefix ending in '*'")
        return values


class Settings(BaseSettings):
    """Every setting can come from the TOML file, the environment or the CLI."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    data_dir: Path = Field(
        default=DEFAULT_DATA_DIR,
        description="Home of the default socket and SQLite file; relative to the cwd.",
    )
    listen: list[str] = Field(
        default_factory=list,
        description="Addresses to serve on; default: the Unix socket DATA_DIR/sidecar.sock.",
    )
    database_url: str = Field(
        default="",
        description="SQLAlchemy URL; default: the SQLite file DATA_DIR/sidecar.db.",
    )
    health_listen: list[str] = Field(
        default_factory=list,
        description=(
            "Addresses serving only grpc.health.v1, for probes that cannot reach the API "
            "listeners (a kubelet on the pod IP); any interface is allowed here."
        ),
    )
    admin_listen: list[str] = Field(
        default_factory=list,
        description=(
            "Addresses of the admin HTTP listener (/metrics, for Prometheus); off when empty. "
            "Loopback, or the pod IP so Prometheus can scrape it: any interface is allowed."
        ),
    )
    unix_socket_mode: int = Field(
        default=0o660,
        ge=0,
        le=0o777,
        description=(
            "Permissions of the Unix sockets: owner and group may connect (a host container "
            "sharing the pod's fsGroup), others may not."
        ),
    )
    allow_non_loopback: bool = Field(
        default=False,
        description="Allow TCP listeners on non-loopback addresses (a pod-IP health port, say).",
    )
    tls_cert_file: Path | None = Field(
        default=None,
        description="PEM certificate chain: the TCP API listeners serve TLS with it.",
    )
    tls_key_file: Path | None = Field(default=None, description="PEM private key of tls_cert_file.")
    tls_client_ca_file: Path | None = Field(
        default=None,
        description=(
            "PEM CA bundle: TCP API clients must present a certificate it signed (mutual TLS)."
        ),
    )
    insecure_non_loopback: bool = Field(
        default=False,
        description=(
            "Serve a non-loopback TCP API listener without TLS (plaintext, unauthenticated); "
            "logged as a warning at start."
        ),
    )
    max_message_bytes: int = Field(
        default=64 * MIB, ge=MIB, le=1024 * MIB, description="Largest request or response."
    )
    inline_result_bytes: int = Field(
        default=4 * MIB,
        ge=64 * 1024,
        le=1024 * MIB,
        description=(
            "Largest tool result a tool-call response carries whole; a larger one comes as an "
            "elided view with its handle (all of it is in the log)."
        ),
    )
    shutdown_grace_seconds: float = Field(
        default=20.0, ge=0, description="How long in-flight calls may finish after SIGTERM."
    )
    drain_delay_seconds: float = Field(
        default=0.0,
        ge=0,
        description="NOT_SERVING is reported this long before the listeners close.",
    )
    worker_threads: int = Field(
        default=8, ge=1, le=256, description="Threads (and database connections) for storage."
    )
    database_busy_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description=(
            "Longest wait for the database: a SQLite write lock, a PostgreSQL row lock, a "
            "connection; past it the call fails UNAVAILABLE (STORAGE_UNAVAILABLE)."
        ),
    )
    cpu_threads: int = Field(
        default=2,
        ge=1,
        le=64,
        description=(
            "Threads for CPU-heavy steps (tool search and its index builds, schema "
            "validation), apart from the storage threads so they never hold a database worker."
        ),
    )
    search_index_cache_bytes: int = Field(
        default=256 * MIB,
        ge=MIB,
        description=(
            "Memory for tool-search indexes, shared by every Run and turn that reaches the "
            "same tools of the same catalogue versions; least recently used go first."
        ),
    )
    resolution_cache_bytes: int = Field(
        default=128 * MIB,
        ge=MIB,
        description="Memory for catalogues read and resolved turns (surfaces), by bytes.",
    )
    large_buffer_reuse_bytes: int = Field(
        default=256 * MIB,
        ge=0,
        le=2**31 - 1,
        description=(
            "Freed memory blocks up to this size are kept for reuse rather than handed back "
            "to the system at once (glibc malloc's mmap and trim thresholds): a large tool "
            "result is copied several times with the GIL held, ~10x faster into reused pages. "
            "Memory stays nearer its peak; 0 leaves malloc as configured."
        ),
    )
    migrate_on_start: bool = Field(default=True, description="Apply migrations when serving.")
    log_level: str = Field(default="INFO", description="Python logging level.")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="Log lines as text, or as JSON objects one per line (with the RPC, tenant, "
        "Run id, connection, correlation id and trace id of the call they belong to).",
    )
    tracing: Literal["off", "otlp"] = Field(
        default="off",
        description="OpenTelemetry traces: off, or exported by OTLP/gRPC as the standard "
        "OTEL_* variables say (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...).",
    )
    mcp_commands: dict[str, StdioCommand] = Field(
        default_factory=dict,
        description="The stdio commands connections may name, by name; nothing else runs.",
    )
    catalog_ttl_seconds: float = Field(
        default=300.0, gt=0, description="Every catalogue is re-listed at least this often."
    )
    tool_call_timeout_seconds: float = Field(
        default=60.0, gt=0, description="How long a tool call may take unless the request says."
    )
    mcp_connect_timeout_seconds: float = Field(
        default=30.0, gt=0, description="How long connecting and the first listing may take."
    )
    mcp_reconnect_min_seconds: float = Field(
        default=0.5, gt=0, description="First delay before reconnecting a lost session."
    )
    mcp_reconnect_max_seconds: float = Field(
        default=30.0, gt=0, description="Longest delay between reconnection attempts."
    )
    semantic_search: Literal["auto", "off"] = Field(
        default="auto",
        description="Tool search fuses sentence embeddings with keywords when the model "
        "package is installed (auto), or uses keywords alone (off).",
    )
    mcp_list_changed_debounce_seconds: float = Field(
        default=0.25,
        ge=0,
        description="tools/list_changed notifications within this window cause one refresh.",
    )
    admin_ui_allow_remote: bool = Field(
        default=False,
        description="Serve the Run inspector (/ui) to clients beyond loopback; off: only "
        "loopback and Unix-socket clients get it, even on an admin listener on the pod IP.",
    )
    assembly_journal: bool = Field(
        default=True,
        description="Keep one row of metadata per AssemblePrompt (zone sizes and digests, the "
        "tool surface, elisions; never content) for the Run inspector.",
    )
    assembly_journal_retention_hours: float = Field(
        default=168.0,
        gt=0,
        description="How long assembly journal rows are kept before they are deleted.",
    )

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.upper() not in logging.getLevelNamesMapping():
            raise ValueError("not a logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return value.upper()

    @field_validator("unix_socket_mode", mode="before")
    @classmethod
    def _octal_mode(cls, value: object) -> object:
        # The file can write 0o660; a flag or the environment may too.
        if isinstance(value, str) and value.strip().lower().startswith("0o"):
            return int(value.strip(), 8)
        return value

    @field_validator("listen", "health_listen", "admin_listen")
    @classmethod
    def _valid_addresses(cls, values: list[str]) -> list[str]:
        for value in values:
            parse_listen_address(value)
        return values

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The TOML source reads model_config["toml_file"], which load_settings sets.
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls)

    def listen_addresses(self) -> list[ListenAddress]:
        values = self.listen or [f"unix://{(self.data_dir / 'sidecar.sock').resolve()}"]
        addresses = [parse_listen_address(value) for value in values]
        self.tls_files()
        for address in addresses:
            if address.is_loopback:
                continue
            if not self.allow_non_loopback:
                raise ValueError(
                    f"{address.grpc_target} is not a loopback address; set allow_non_loopback "
                    "to serve beyond this machine"
                )
            if self.tls_cert_file is None and not self.insecure_non_loopback:
                raise ValueError(
                    f"{address.grpc_target} is not a loopback address: serve TLS there "
                    "(tls_cert_file and tls_key_file, and tls_client_ca_file for mutual TLS), "
                    "or set insecure_non_loopback to serve plaintext, unauthenticated gRPC"
                )
        return addresses

    def tls_files(self) -> tuple[Path, Path, Path | None] | None:
        """(certificate, key, client CA or None) when TLS is configured, else None."""
        if self.tls_cert_file is None and self.tls_key_file is None:
            if self.tls_client_ca_file is not None:
                raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file")
            return None
        if self.tls_cert_file is None or self.tls_key_file is None:
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file

    def health_listen_addresses(self) -> list[ListenAddress]:
        return [parse_listen_address(value) for value in self.health_listen]

    def admin_listen_addresses(self) -> list[ListenAddress]:
        return [parse_listen_address(value) for value in self.admin_listen]

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'sidecar.db').resolve()}"


def load_settings(config_file: str | None = None, **overrides: Any) -> Settings:
    """Settings from the file (flag or PSYCH_SIDECAR_CONFIG_FILE), environment and overrides."""
    path = config_file or os.environ.get(CONFIG_FILE_ENV)
    settings_class = Settings
    if path:
        toml_file = Path(path)
        if not toml_file.is_file():
            raise ValueError(f"config file {toml_file} does not exist")

        class FileSettings(Settings):
            model_config = SettingsConfigDict(**{**Settings.model_config, "toml_file": toml_file})

        settings_class = FileSettings
    return settings_class(**{key: value for key, value in overrides.items() if value is not None})

"""Configuration: defaults < optional TOML file < environment (PSYCH_SIDECAR_*) < CLI flags."""

from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    create_model,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
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


class _Group(BaseModel):
    """Settings of one concern. A field's key in the file, the environment and the flags is
    its alias where it has one (`mcp_commands` for `McpSettings.commands`), else its name:
    the keys are flat, as they always were."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _valid_addresses(values: list[str]) -> list[str]:
    for value in values:
        parse_listen_address(value)
    return values


# Listener addresses, each checked by parse_listen_address.
ListenAddresses = Annotated[list[str], AfterValidator(_valid_addresses)]


class ListenerSettings(_Group):
    """The gRPC API and health listeners: addresses, sockets, TLS, message size, shutdown."""

    listen: ListenAddresses = Field(
        default_factory=list,
        description="Addresses to serve on; default: the Unix socket DATA_DIR/sidecar.sock.",
    )
    health_listen: ListenAddresses = Field(
        default_factory=list,
        description=(
            "Addresses serving only grpc.health.v1, for probes that cannot reach the API "
            "listeners (a kubelet on the pod IP); any interface is allowed here."
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
    shutdown_grace_seconds: float = Field(
        default=20.0, ge=0, description="How long in-flight calls may finish after SIGTERM."
    )
    drain_delay_seconds: float = Field(
        default=0.0,
        ge=0,
        description="NOT_SERVING is reported this long before the listeners close.",
    )

    @field_validator("unix_socket_mode", mode="before")
    @classmethod
    def _octal_mode(cls, value: object) -> object:
        # The file can write 0o660; a flag or the environment may too.
        if isinstance(value, str) and value.strip().lower().startswith("0o"):
            return int(value.strip(), 8)
        return value


class StorageSettings(_Group):
    """The database and the threads that use it."""

    database_url: str = Field(
        default="",
        description="SQLAlchemy URL; default: the SQLite file DATA_DIR/sidecar.db.",
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
    database_pooling: Literal["session", "transaction"] = Field(
        default="session",
        description=(
            "How PostgreSQL connections reach the server: session, each a server session of "
            "its own (direct, or PgBouncer in session mode); transaction, through PgBouncer in "
            "transaction mode (no server-side prepared statements, the lock timeout set per "
            "transaction). Ignored on SQLite. docs/operations.md."
        ),
    )
    run_retention_hours: float = Field(
        default=0,
        ge=0,
        description=(
            "Delete Runs created longer ago than this, with everything stored for them: the "
            "sidecar looks every 10 minutes (on PostgreSQL one sidecar deletes at a time); 0 "
            "keeps Runs until deleted. docs/operations.md, Deleting data."
        ),
    )
    migrate_on_start: bool = Field(default=True, description="Apply migrations when serving.")
    migration_database_url: str = Field(
        default="",
        description=(
            "SQLAlchemy URL migrations run on (`serve`'s at start, `migrate`); default: "
            "database_url. PostgreSQL's own address when database_url names PgBouncer, so a "
            "long migration holds no pooled server connection."
        ),
    )
    secret_keys: SecretStr = Field(
        default=SecretStr(""),
        description=(
            "Keys sealing the secrets stored in the database (AES-256-GCM), each the base64 of "
            "32 random bytes, separated by commas; the first seals, all open. Read before "
            "secret_key_file's. Prefer the environment or a file: a flag shows in `ps`."
        ),
    )
    secret_key_file: Path | None = Field(
        default=None,
        description=(
            "File of keys sealing stored secrets, one a line, the first sealing (after "
            "secret_keys). Neither set: on SQLite the file DATABASE.keys beside the database, "
            "made (mode 0600) if missing; PostgreSQL refuses to start."
        ),
    )


class McpSettings(_Group):
    """MCP sessions: the stdio commands allowed, catalogue refreshes, tool calls, reconnection."""

    commands: dict[str, StdioCommand] = Field(
        alias="mcp_commands",
        default_factory=dict,
        description="The stdio commands connections may name, by name; nothing else runs.",
    )
    catalog_ttl_seconds: float = Field(
        default=300.0, gt=0, description="Every catalogue is re-listed at least this often."
    )
    tool_call_timeout_seconds: float = Field(
        default=60.0, gt=0, description="How long a tool call may take unless the request says."
    )
    connect_timeout_seconds: float = Field(
        alias="mcp_connect_timeout_seconds",
        default=30.0,
        gt=0,
        description="How long connecting and the first listing may take.",
    )
    reconnect_min_seconds: float = Field(
        alias="mcp_reconnect_min_seconds",
        default=0.5,
        gt=0,
        description="First delay before reconnecting a lost session.",
    )
    reconnect_max_seconds: float = Field(
        alias="mcp_reconnect_max_seconds",
        default=30.0,
        gt=0,
        description="Longest delay between reconnection attempts.",
    )
    list_changed_debounce_seconds: float = Field(
        alias="mcp_list_changed_debounce_seconds",
        default=0.25,
        ge=0,
        description="tools/list_changed notifications within this window cause one refresh.",
    )
    min_list_ttl_seconds: float = Field(
        alias="mcp_min_list_ttl_seconds",
        default=60.0,
        gt=0,
        description=(
            "A server's tools/list ttlMs shorter than this counts as this: the soonest a "
            "catalogue is re-listed because its server said it goes stale."
        ),
    )
    task_poll_min_seconds: float = Field(
        default=1.0,
        gt=0,
        description="A call running as a task is first polled this long after it starts.",
    )
    task_poll_max_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "A task's polls back off, doubling, up to this (never sooner than its server asks)."
        ),
    )
    task_look_seconds: float = Field(
        default=0.5,
        gt=0,
        description=(
            "How often the sidecar looks in the database for tasks due a poll, its own and "
            "other sidecars' (a query each time): a poll is at most this late, or "
            "task_poll_min_seconds if that is shorter."
        ),
    )
    input_wait_seconds: float = Field(
        alias="mcp_input_wait_seconds",
        default=600.0,
        gt=0,
        le=86400,
        description=(
            "How long a call whose server asked for input waits for the host's answer "
            "(ContinueToolCall); then it ends as a tool error saying nobody answered."
        ),
    )
    max_held_calls: int = Field(
        alias="mcp_max_held_calls",
        default=1000,
        gt=0,
        description=(
            "At most this many calls per 2025-11-25 session may be open at once while their "
            "server's question waits; more are refused as tool errors."
        ),
    )
    stdio_max_line_bytes: int = Field(
        alias="mcp_stdio_max_line_bytes",
        # As one server-sent event over HTTP (docs/operations.md, "MCP servers").
        default=256 * MIB,
        gt=0,
        description=(
            "The longest line (one JSON-RPC message) read from a stdio server; a longer one "
            "ends the connection."
        ),
    )


class OAuthOutboundSettings(_Group):
    """OAuth for HTTP connections: which addresses the sidecar's own OAuth requests (metadata
    discovery, client registration, tokens) may go to, and their bounds."""

    allow_http_loopback: bool = Field(
        alias="oauth_allow_http_loopback",
        default=False,
        description=(
            "Let OAuth requests use plain http and loopback addresses (a server on the same "
            "host, tests); otherwise https only, and never to loopback."
        ),
    )
    allowed_networks: list[str] = Field(
        alias="oauth_allowed_networks",
        default_factory=list,
        description=(
            "Private, link-local or other non-public networks (CIDR) OAuth requests may go to; "
            "by default only public addresses."
        ),
    )
    request_timeout_seconds: float = Field(
        alias="oauth_request_timeout_seconds",
        default=10.0,
        gt=0,
        description="How long one OAuth request (redirects included) may take.",
    )
    max_response_bytes: int = Field(
        alias="oauth_max_response_bytes",
        default=MIB,
        ge=1024,
        description="The largest OAuth response (metadata, registration, token) read.",
    )
    max_redirects: int = Field(
        alias="oauth_max_redirects",
        default=3,
        ge=0,
        le=10,
        description="Redirects a metadata request may follow (each target is checked too).",
    )
    sign_in_state_seconds: float = Field(
        alias="oauth_sign_in_state_seconds",
        default=600.0,
        gt=0,
        le=3600,
        description="How long a begun sign-in's state stays valid.",
    )
    refresh_margin_seconds: float = Field(
        alias="oauth_refresh_margin_seconds",
        default=60.0,
        ge=0,
        description=(
            "Tokens are renewed this long before they expire (at most a fifth of their lifetime)."
        ),
    )

    @field_validator("allowed_networks")
    @classmethod
    def _valid_networks(cls, values: list[str]) -> list[str]:
        for value in values:
            ipaddress.ip_network(value, strict=False)
        return values


class SearchSettings(_Group):
    """Tool search."""

    semantic_search: Literal["auto", "off"] = Field(
        default="auto",
        description="Tool search fuses sentence embeddings with keywords when the model "
        "package is installed (auto), or uses keywords alone (off).",
    )
    search_model_cache_dir: Path | None = Field(
        default=None,
        description="Directory the search model is prepared in once (inflated from its "
        "package, about 90 MB) and memory-mapped from; default: $XDG_CACHE_HOME/psych-sidecar/"
        "search-model, else ~/.cache/psych-sidecar/search-model.",
    )
    search_index_cache_bytes: int = Field(
        default=256 * MIB,
        ge=MIB,
        description=(
            "Memory for tool-search indexes, shared by every Run and turn that reaches the "
            "same tools of the same catalogue versions; least recently used go first."
        ),
    )


class PromptSettings(_Group):
    """Turns and prompts: resolved surfaces, inline tool results, the assembly journal."""

    resolution_cache_bytes: int = Field(
        default=128 * MIB,
        ge=MIB,
        description="Memory for catalogues read and resolved turns (surfaces), by bytes.",
    )
    parsed_result_cache_bytes: int = Field(
        default=128 * MIB,
        ge=0,
        description=(
            "Memory for stored results kept parsed for JMESPath queries (read_tool_output, "
            "ReadToolOutput), estimated from their JSON's size; least recently used go first; "
            "0 keeps none."
        ),
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


class TelemetrySettings(_Group):
    """Logs and traces."""

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
    tracing_sample_ratio: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Share of traces sampled, parent-based: a call continuing a host's trace "
        "follows the host's decision; a trace starting here is sampled at this ratio (by its "
        "trace id). Unset: OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG when set, else 0.1.",
    )

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.upper() not in logging.getLevelNamesMapping():
            raise ValueError("not a logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return value.upper()


class AdminSettings(_Group):
    """The admin HTTP listener (/metrics, the Run inspector)."""

    listen: ListenAddresses = Field(
        alias="admin_listen",
        default_factory=list,
        description=(
            "Addresses of the admin HTTP listener (/metrics, for Prometheus); off when empty. "
            "Loopback, or the pod IP so Prometheus can scrape it: any interface is allowed."
        ),
    )
    ui_allow_remote: bool = Field(
        alias="admin_ui_allow_remote",
        default=False,
        description="Serve the Run inspector (/ui) to clients beyond loopback; off: only "
        "loopback and Unix-socket clients get it, even on an admin listener on the pod IP.",
    )


class ProcessSettings(_Group):
    """The process: CPU threads and how malloc keeps large blocks."""

    cpu_threads: int = Field(
        default=2,
        ge=1,
        le=64,
        description=(
            "Threads for CPU-heavy steps (tool search and its index builds, schema "
            "validation), apart from the storage threads so they never hold a database worker; "
            "and the threads, at the lowest CPU priority, that encode a listing for search."
        ),
    )
    large_buffer_reuse_bytes: int = Field(
        default=256 * MIB,
        ge=0,
        le=2**31 - 1,
        description=(
            "Freed memory blocks up to this size are kept for reuse rather than handed back "
            "to the system at once (glibc malloc's mmap and trim thresholds): a large tool "
            "result is copied several times with the GIL held, ~10x faster into reused pages. "
            "What is kept goes back once large results stop landing (within ~10 s); 0 leaves "
            "malloc as configured."
        ),
    )


class Settings(BaseSettings):
    """Every setting, grouped by concern. Each comes from the TOML file, the environment
    (PSYCH_SIDECAR_<KEY>) or the CLI (--<key>) under its flat key (`SETTING_KEYS`)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    data_dir: Path = Field(
        default=DEFAULT_DATA_DIR,
        description="Home of the default socket and SQLite file; relative to the cwd.",
    )
    listeners: ListenerSettings = Field(default_factory=ListenerSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
    oauth: OAuthOutboundSettings = Field(default_factory=OAuthOutboundSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    prompt: PromptSettings = Field(default_factory=PromptSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    process: ProcessSettings = Field(default_factory=ProcessSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Every source speaks the flat keys; each is nested into the groups before the
        # sources are merged, so that a key from the environment still beats the file's.
        # The TOML source reads model_config["toml_file"], which load_settings sets.
        return (
            _Nested(settings_cls, init_settings),
            _Nested(settings_cls, EnvSettingsSource(_FlatKeys)),
            _NestedToml(settings_cls),
        )

    def listen_addresses(self) -> list[ListenAddress]:
        listeners = self.listeners
        values = listeners.listen or [f"unix://{(self.data_dir / 'sidecar.sock').resolve()}"]
        addresses = [parse_listen_address(value) for value in values]
        self.tls_files()
        for address in addresses:
            if address.is_loopback:
                continue
            if not listeners.allow_non_loopback:
                raise ValueError(
                    f"{address.grpc_target} is not a loopback address; set allow_non_loopback "
                    "to serve beyond this machine"
                )
            if listeners.tls_cert_file is None and not listeners.insecure_non_loopback:
                raise ValueError(
                    f"{address.grpc_target} is not a loopback address: serve TLS there "
                    "(tls_cert_file and tls_key_file, and tls_client_ca_file for mutual TLS), "
                    "or set insecure_non_loopback to serve plaintext, unauthenticated gRPC"
                )
        return addresses

    def tls_files(self) -> tuple[Path, Path, Path | None] | None:
        """(certificate, key, client CA or None) when TLS is configured, else None."""
        cert_file, key_file = self.listeners.tls_cert_file, self.listeners.tls_key_file
        if cert_file is None and key_file is None:
            if self.listeners.tls_client_ca_file is not None:
                raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file")
            return None
        if cert_file is None or key_file is None:
            raise ValueError("tls_cert_file and tls_key_file go together")
        return cert_file, key_file, self.listeners.tls_client_ca_file

    def health_listen_addresses(self) -> list[ListenAddress]:
        return [parse_listen_address(value) for value in self.listeners.health_listen]

    def admin_listen_addresses(self) -> list[ListenAddress]:
        return [parse_listen_address(value) for value in self.admin.listen]

    def resolved_database_url(self) -> str:
        return self.storage.database_url or f"sqlite:///{(self.data_dir / 'sidecar.db').resolve()}"

    def resolved_migration_database_url(self) -> str:
        return self.storage.migration_database_url or self.resolved_database_url()


@dataclass(frozen=True, slots=True)
class SettingKey:
    """Where a flat key's value lives in `Settings`: its group (None: Settings itself), the
    attribute there, and the field that describes it."""

    group: str | None
    attribute: str
    field: FieldInfo

    def value(self, settings: Settings) -> Any:
        owner = settings if self.group is None else getattr(settings, self.group)
        return getattr(owner, self.attribute)


def _setting_keys() -> dict[str, SettingKey]:
    keys: dict[str, SettingKey] = {}
    for name, field in Settings.model_fields.items():
        group = field.annotation
        if isinstance(group, type) and issubclass(group, _Group):
            for attribute, inner in group.model_fields.items():
                keys[inner.alias or attribute] = SettingKey(name, attribute, inner)
        else:
            keys[name] = SettingKey(None, name, field)
    return keys


# Every setting by its flat key: the TOML key, the environment's PSYCH_SIDECAR_<KEY>, --<key>.
SETTING_KEYS = _setting_keys()


class _FlatEnvironment(BaseSettings):
    # The environment source reads its fields only and never validates with it (Settings
    # does): its validator is not built (a tenth of the settings' start-up).
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", defer_build=True)


# A settings class with the flat keys as fields, for the environment source to read
# PSYCH_SIDECAR_<KEY> (JSON for a list or a table) as it always has.
_FlatKeys = create_model(  # type: ignore[call-overload]
    "_FlatKeys",
    __base__=_FlatEnvironment,
    **{key: (setting.field.annotation, None) for key, setting in SETTING_KEYS.items()},
)


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """A source's values, read under their flat keys, moved into their groups."""
    nested: dict[str, Any] = {}
    # A group given whole (Settings(**other.model_dump())) first, its flat keys over it.
    for key, value in flat.items():
        if key not in SETTING_KEYS:
            nested[key] = dict(value) if isinstance(value, dict) else value
    for key, value in flat.items():
        setting = SETTING_KEYS.get(key)
        if setting is None:
            continue
        if setting.group is None:
            nested[key] = value
        else:
            nested.setdefault(setting.group, {})[key] = value
    return nested


class _Nested(PydanticBaseSettingsSource):
    """A source that speaks the flat keys (the init arguments, the environment), nested."""

    def __init__(self, settings_cls: type[BaseSettings], flat: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self._flat = flat

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads the flat source whole

    def __call__(self) -> dict[str, Any]:
        return _nest(self._flat())


class _NestedToml(TomlConfigSettingsSource):
    """The TOML file's flat keys, nested (a TOML source still, as pydantic-settings checks
    for one where `toml_file` is configured)."""

    def __call__(self) -> dict[str, Any]:
        return _nest(super().__call__())


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

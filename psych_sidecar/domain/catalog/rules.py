"""Rules for connections and their versioned catalogues, and what they need from storage.

The catalogue is a versioned, soft-delete table: a refresh writes every tool it saw at a new
version and marks every older current tool removed as of that version; nothing is ever
hard-deleted, so any version reads back and two versions diff cheaply.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from psych_sidecar.domain.catalog.connections import (
    CatalogTool,
    Connection,
    ConnectionStatus,
    TransportKind,
)
from psych_sidecar.domain.errors import Reason, SidecarError, field_invalid, field_required
from psych_sidecar.domain.runlog import validate_name

CONNECTION_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
HEADER_NAME_PATTERN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
MAX_ARGUMENT_LENGTH = 4096
MAX_DESCRIPTION_LENGTH = 8192
MAX_TOOL_PATTERN_LENGTH = 1024


@dataclass(frozen=True, slots=True)
class AllowedCommand:
    """An operator-allowed stdio command, as the domain sees it: the API may only name it."""

    allow_extra_args: bool


@dataclass(frozen=True, slots=True)
class StoredConnection:
    """A connection as stored, secrets included: for the MCP layer only, never for a reply."""

    connection: Connection
    # Bumped by every put; a session knows from it whether it runs the current config.
    revision: int
    catalog_version: int
    update_time: datetime


@dataclass(frozen=True, slots=True)
class CatalogWrite:
    """The outcome of recording one complete listing."""

    catalog_version: int
    tool_count: int
    # False when the listing equalled the current version, which then stays current.
    changed: bool


@dataclass(frozen=True, slots=True)
class CatalogVersion:
    """One stored version of a connection's catalogue."""

    catalog_version: int
    tool_count: int
    # SHA-256 of the listing (listing_fingerprint), lowercase hex.
    sha256: str
    create_time: datetime


@dataclass(frozen=True, slots=True)
class CatalogDiff:
    added: tuple[CatalogTool, ...]
    changed: tuple[CatalogTool, ...]
    removed: tuple[CatalogTool, ...]


def connection_not_found(tenant: str, name: str) -> SidecarError:
    return SidecarError(
        Reason.CONNECTION_NOT_FOUND,
        f"no connection {name!r} for tenant {tenant!r}",
        tenant=tenant,
        connection=name,
    )


def catalog_version_not_found(name: str, version: int) -> SidecarError:
    return SidecarError(
        Reason.CATALOG_VERSION_NOT_FOUND,
        f"connection {name!r} has no catalogue version {version}",
        connection=name,
        catalog_version=version,
    )


def validate_connection_name(value: str, field_path: str) -> None:
    if not value:
        raise field_required(field_path)
    if not CONNECTION_NAME_PATTERN.fullmatch(value):
        raise field_invalid(field_path, "must be 1-64 characters of [A-Za-z0-9._-]")


def validate_connection(
    connection: Connection, allowed_commands: Mapping[str, AllowedCommand]
) -> None:
    """Refuse a connection that could never work, or that names a command the operator did
    not allow. Field paths are those of PutConnectionRequest."""
    validate_name(connection.tenant, "connection.tenant")
    validate_connection_name(connection.name, "connection.name")
    if connection.transport is TransportKind.STDIO:
        _validate_stdio(connection, allowed_commands)
    else:
        _validate_url(connection.url, "connection.http.url")
        _validate_headers(connection.headers)
    if len(connection.description) > MAX_DESCRIPTION_LENGTH:
        raise field_invalid(
            "connection.description", f"longer than {MAX_DESCRIPTION_LENGTH} characters"
        )
    for field_name in ("eager_tools", "allow_tools", "deny_tools"):
        for index, value in enumerate(getattr(connection, field_name)):
            path = f"connection.{field_name}[{index}]"
            if not value:
                raise field_required(path)
            if len(value) > MAX_TOOL_PATTERN_LENGTH or "\x00" in value:
                raise field_invalid(
                    path, f"must be at most {MAX_TOOL_PATTERN_LENGTH} characters, without NUL"
                )


def _validate_stdio(connection: Connection, allowed_commands: Mapping[str, AllowedCommand]) -> None:
    if not connection.command:
        raise field_required("connection.stdio.command")
    allowed = allowed_commands.get(connection.command)
    if allowed is None:
        raise SidecarError(
            Reason.COMMAND_NOT_ALLOWED,
            f"command {connection.command!r} is not one the operator allowed in the sidecar's "
            "configuration (mcp_commands)",
            command=connection.command,
        )
    if connection.args and not allowed.allow_extra_args:
        raise field_invalid(
            "connection.stdio.args",
            f"the operator's entry for {connection.command!r} takes no extra arguments",
        )
    for index, argument in enumerate(connection.args):
        if len(argument) > MAX_ARGUMENT_LENGTH or "\x00" in argument:
            raise field_invalid(
                f"connection.stdio.args[{index}]",
                f"must be at most {MAX_ARGUMENT_LENGTH} characters, without NUL",
            )
    _validate_strings(connection.env, "connection.stdio.env")


def _validate_url(url: str, field_path: str) -> None:
    if not url:
        raise field_required(field_path)
    if not re.fullmatch(r"https?://[^\s/?#]+[^\s]*", url):
        raise field_invalid(field_path, "must be an http:// or https:// URL")


def _validate_strings(values: Mapping[str, str], field_path: str) -> None:
    # Keys are named in errors, values never: they are secrets.
    for key, value in values.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise field_invalid(
                f"{field_path}[{key!r}]",
                "names must be non-empty without '=' or NUL; values without NUL",
            )


def _validate_headers(headers: Mapping[str, str]) -> None:
    # Refused here rather than by the HTTP client later, whose error would quote the value.
    for name, value in headers.items():
        if not HEADER_NAME_PATTERN.fullmatch(name) or any(c in value for c in "\r\n\x00"):
            raise field_invalid(
                f"connection.http.headers[{name!r}]",
                "names must be HTTP tokens; values must not hold CR, LF or NUL",
            )


def listing_fingerprint(tools: Sequence[CatalogTool]) -> str:
    """A digest of a listing's content, independent of the order the server sent it in."""
    digest = hashlib.sha256()
    for tool in sorted(tools, key=lambda t: t.name):
        for value in (
            tool.name.encode(),
            tool.description.encode(),
            tool.input_schema_json,
            tool.output_schema_json,
            tool.annotations_json,
        ):
            digest.update(struct.pack(">Q", len(value)))
            digest.update(value)
    return digest.hexdigest()


def diff_catalog(older: Sequence[CatalogTool], newer: Sequence[CatalogTool]) -> CatalogDiff:
    """Added and changed tools as of the newer version; removed ones as of the older."""
    before = {tool.name: tool for tool in older}
    after = {tool.name: tool for tool in newer}
    return CatalogDiff(
        added=tuple(after[name] for name in sorted(after.keys() - before.keys())),
        changed=tuple(
            after[name]
            for name in sorted(after.keys() & before.keys())
            if _content(after[name]) != _content(before[name])
        ),
        removed=tuple(before[name] for name in sorted(before.keys() - after.keys())),
    )


def _content(tool: CatalogTool) -> tuple[str, bytes, bytes, bytes]:
    return (
        tool.description,
        tool.input_schema_json,
        tool.output_schema_json,
        tool.annotations_json,
    )


class ConnectionSupervisor(Protocol):
    """What the connection use cases need of the MCP layer (``McpManager``): it owns the
    sessions, so putting, deleting and refreshing a connection go through it."""

    async def put_connection(self, connection: Connection) -> tuple[Connection, ConnectionStatus]:
        """Validate and store the connection, then (re)start its session."""
        ...

    async def delete_connection(self, tenant: str, name: str) -> None:
        """Stop its session and soft-delete it."""
        ...

    async def refresh_catalog(self, tenant: str, name: str) -> CatalogWrite:
        """Re-list its tools now and store the listing."""
        ...

    def status(self, stored: StoredConnection) -> ConnectionStatus:
        """Its state as this sidecar sees it."""
        ...


class ConnectionRepository(Protocol):
    """Connections and catalogues in storage. Every method is one transaction."""

    def put_connection(self, connection: Connection) -> StoredConnection:
        """Create or replace (also revive a deleted one); bumps the revision."""
        ...

    def delete_connection(self, tenant: str, name: str) -> bool:
        """Mark deleted, wipe its secrets, and remove its tools from the current catalogue
        at a new, empty version. False when there was no such live connection."""
        ...

    def get_connection(self, tenant: str, name: str) -> StoredConnection | None:
        """A live connection, secrets included."""
        ...

    def list_connections(
        self, tenant: str, after_name: str, limit: int
    ) -> tuple[list[StoredConnection], bool]:
        """Live connections by name after `after_name`, and whether more follow."""
        ...

    def all_connections(self) -> list[StoredConnection]:
        """Every live connection of every tenant, secrets included."""
        ...

    def connection_versions(self, tenant: str) -> dict[str, tuple[int, int]]:
        """name -> (revision, catalog_version) of the tenant's live connections: one cheap
        read that tells a cache what changed."""
        ...

    def write_catalog(
        self, tenant: str, server: str, revision: int, tools: Sequence[CatalogTool]
    ) -> CatalogWrite | None:
        """Record one complete listing made by a session of that revision; None when the
        connection is gone or was replaced since (a stale session must not write)."""
        ...

    def catalog_tools(
        self, tenant: str, server: str, version: int
    ) -> tuple[int, list[CatalogTool]] | None:
        """The version read (0 asks for the current one) and its tools, sorted by name;
        None when the connection has no such version. Works for deleted connections too."""
        ...

    def catalog_versions(
        self, tenant: str, server: str, before_version: int, limit: int
    ) -> tuple[list[CatalogVersion], bool] | None:
        """The connection's versions newest first, at most `limit` of them below
        `before_version` (0: from the newest), and whether more remain; None when no such
        connection was ever stored. Works for deleted connections too."""
        ...

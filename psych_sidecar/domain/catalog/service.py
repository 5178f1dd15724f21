"""ConnectionService's use cases: put, delete, list, refresh, read and diff catalogues.

The MCP layer is reached through :class:`ConnectionSupervisor`, storage through
:class:`ConnectionRepository`."""

from __future__ import annotations

from datetime import datetime

from psych_sidecar.domain.catalog.connections import (
    CatalogTool,
    Connection,
    ConnectionStatus,
)
from psych_sidecar.domain.catalog.ports import ConnectionRepository, ConnectionSupervisor
from psych_sidecar.domain.catalog.rules import (
    CatalogDiff,
    CatalogVersion,
    CatalogWrite,
    StoredConnection,
    catalog_version_not_found,
    connection_not_found,
    diff_catalog,
    validate_connection_name,
)
from psych_sidecar.domain.catalog.secrets import without_secrets
from psych_sidecar.domain.errors import field_invalid, field_required
from psych_sidecar.domain.runlog import (
    OffLoop,
    decode_token,
    encode_token,
    page_size,
    validate_name,
)


def _tool_bytes(tool: CatalogTool) -> int:
    return (
        len(tool.name)
        + len(tool.description.encode())
        + len(tool.input_schema_json)
        + len(tool.output_schema_json)
        + len(tool.annotations_json)
    )


class ConnectionService:
    def __init__(
        self, manager: ConnectionSupervisor, store: ConnectionRepository, blocking: OffLoop
    ) -> None:
        self._manager = manager
        self._store = store
        self._blocking = blocking

    async def put(self, connection: Connection) -> tuple[Connection, ConnectionStatus]:
        return await self._manager.put_connection(connection)

    async def delete(self, tenant: str, name: str) -> None:
        _validate_key(tenant, name)
        await self._manager.delete_connection(tenant, name)

    async def list_connections(
        self, tenant: str, requested_page_size: int, page_token: str
    ) -> tuple[list[tuple[Connection, ConnectionStatus]], str]:
        validate_name(tenant, "tenant")
        size = page_size(requested_page_size)
        scope = f"connections/{tenant}"
        after = decode_token(page_token, scope)
        if after is not None and not isinstance(after, str):
            raise field_invalid("page_token", "not a token this sidecar issued")
        rows: list[StoredConnection]
        rows, more = await self._blocking(self._store.list_connections, tenant, after or "", size)
        listed = [(without_secrets(row.connection), self._manager.status(row)) for row in rows]
        next_token = encode_token(scope, rows[-1].connection.name) if more and rows else ""
        return listed, next_token

    async def begin_sign_in(self, tenant: str, name: str) -> tuple[str, str, datetime]:
        _validate_key(tenant, name)
        return await self._manager.begin_sign_in(tenant, name)

    async def complete_sign_in(
        self, tenant: str, state: str, code: str, name: str, *, iss: str | None
    ) -> tuple[Connection, ConnectionStatus]:
        validate_name(tenant, "tenant")
        if not state:
            raise field_required("state")
        if not code:
            raise field_required("code")
        if len(state) > 512:
            raise field_invalid("state", "longer than any state this sidecar issues")
        if len(code) > 4096:
            raise field_invalid("code", "longer than 4096 characters")
        if name:
            validate_connection_name(name, "name")
        if iss is not None and len(iss) > 2048:
            raise field_invalid("iss", "longer than 2048 characters")
        return await self._manager.complete_sign_in(tenant, state, code, name, iss=iss)

    async def refresh(self, tenant: str, name: str) -> CatalogWrite:
        _validate_key(tenant, name)
        return await self._manager.refresh_catalog(tenant, name)

    async def list_tools(
        self,
        tenant: str,
        name: str,
        version: int,
        requested_page_size: int,
        page_token: str,
        max_bytes: int,
    ) -> tuple[list[CatalogTool], str]:
        """A page of one version's tools. A version never changes, so a page is an offset;
        the token also pins the version, so paging "the current one" stays on one version."""
        _validate_key(tenant, name)
        _validate_version(version, "catalog_version")
        size = page_size(requested_page_size)
        scope = f"catalog/{tenant}/{name}/{version}"
        position = decode_token(page_token, scope)
        offset = 0
        if position is not None:
            pinned, _, start = str(position).partition(":")
            if not (pinned.isdigit() and start.isdigit()):
                raise field_invalid("page_token", "not a token this sidecar issued")
            version, offset = int(pinned), int(start)
        resolved, tools = await self._read(tenant, name, version)
        page: list[CatalogTool] = []
        total = 0
        for tool in tools[offset : offset + size]:
            total += _tool_bytes(tool)
            if page and total > max_bytes:
                break
            page.append(tool)
        end = offset + len(page)
        next_token = encode_token(scope, f"{resolved}:{end}") if end < len(tools) else ""
        return page, next_token

    async def diff(self, tenant: str, name: str, from_version: int, to_version: int) -> CatalogDiff:
        _validate_key(tenant, name)
        if from_version == 0:
            raise field_required("from_version")
        _validate_version(from_version, "from_version")
        _validate_version(to_version, "to_version")
        _, older = await self._read(tenant, name, from_version)
        _, newer = await self._read(tenant, name, to_version)
        return diff_catalog(older, newer)

    async def list_versions(
        self, tenant: str, name: str, requested_page_size: int, page_token: str
    ) -> tuple[list[CatalogVersion], str]:
        """A page of a connection's catalogue versions, newest first."""
        _validate_key(tenant, name)
        size = page_size(requested_page_size)
        scope = f"catalog-versions/{tenant}/{name}"
        before = decode_token(page_token, scope)
        if before is not None and (not isinstance(before, int) or before < 1):
            raise field_invalid("page_token", "not a token this sidecar issued")
        read: tuple[list[CatalogVersion], bool] | None = await self._blocking(
            self._store.catalog_versions, tenant, name, before or 0, size
        )
        if read is None:
            raise connection_not_found(tenant, name)
        versions, more = read
        next_token = encode_token(scope, versions[-1].catalog_version) if more and versions else ""
        return versions, next_token

    async def _read(self, tenant: str, name: str, version: int) -> tuple[int, list[CatalogTool]]:
        read: tuple[int, list[CatalogTool]] | None = await self._blocking(
            self._store.catalog_tools, tenant, name, version
        )
        if read is not None:
            return read
        if version == 0 or await self._blocking(self._store.catalog_tools, tenant, name, 0) is None:
            raise connection_not_found(tenant, name)
        raise catalog_version_not_found(name, version)


def _validate_key(tenant: str, name: str) -> None:
    validate_name(tenant, "tenant")
    validate_connection_name(name, "name")


def _validate_version(version: int, field_path: str) -> None:
    if version < 0:
        raise field_invalid(field_path, "must not be negative")

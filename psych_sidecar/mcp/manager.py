"""McpManager: every connection's session in this sidecar, the catalogue's refresh triggers,
and the seam's two implementations (CatalogView for reads, ToolRunner for calls)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio

from psych_sidecar.config import McpSettings, OAuthOutboundSettings
from psych_sidecar.domain.calls import SchemaValidators
from psych_sidecar.domain.catalog import (
    AllowedCommand,
    AuthKind,
    CatalogTool,
    CatalogWrite,
    Connection,
    ConnectionRepository,
    ConnectionState,
    ConnectionStatus,
    McpToolResult,
    OAuthRepository,
    PendingSignIn,
    Scrubber,
    StoredConnection,
    ToolCallFailed,
    connection_authorization_required,
    connection_not_found,
    rejections,
    sign_in_not_applicable,
    validate_connection,
    without_secrets,
)
from psych_sidecar.domain.errors import Reason, SidecarError, short
from psych_sidecar.domain.runlog import RunBlocking
from psych_sidecar.mcp.session_types import CatalogUnavailable, Listing, SessionTimings
from psych_sidecar.telemetry import metrics

if TYPE_CHECKING:
    from psych_sidecar.mcp.oauth.flows import OAuthFlows
    from psych_sidecar.mcp.oauth.grants import TokenKeeper
    from psych_sidecar.mcp.session import ConnectionSession

log = logging.getLogger(__name__)

Key = tuple[str, str]

# Stopping a session waits this long for its owner task (a stdio server gets ~4 s to exit).
_STOP_TIMEOUT = 10.0
# The sweep wakes this many times per TTL, so no catalogue is older than about 1.25 TTL.
_SWEEPS_PER_TTL = 4


def _closed_error() -> SidecarError:
    return SidecarError(
        Reason.CONNECTION_UNREACHABLE,
        "the sidecar is shutting down: no MCP session starts any more",
        detail="shutting down",
    )


@dataclasses.dataclass(slots=True)
class _Running:
    session: ConnectionSession
    task: asyncio.Task[None]


class McpManager:
    """Owns one session per stored connection; implements CatalogView and ToolRunner.

    Async methods run on the server's event loop. The CatalogView methods are synchronous
    and run on storage threads: they read the database and this object's caches, and ask the
    loop (thread-safely) to start sessions for connections another sidecar stored.
    """

    def __init__(
        self,
        store: ConnectionRepository,
        blocking: RunBlocking,
        settings: McpSettings,
        on_listed: Callable[[Sequence[CatalogTool]], None] | None = None,
        oauth: tuple[OAuthOutboundSettings, OAuthRepository] | None = None,
    ):
        """`on_listed` is told every listing this sidecar stores (on the loop: it must not
        block); the server uses it to encode new tools for search ahead of the first search.
        `oauth`: the OAuth requests' settings and the grants' storage (without them, OAuth
        connections stay AUTHORIZATION_REQUIRED)."""
        self._store = store
        self._oauth = oauth
        # Made with the first OAuth need: the module imports the MCP SDK's auth client.
        self._oauth_flows: OAuthFlows | None = None
        self._on_listed = on_listed
        self._blocking = blocking
        self._settings = settings
        self._commands = settings.commands
        self.allowed_commands: Mapping[str, AllowedCommand] = {
            name: AllowedCommand(command.allow_extra_args, tuple(command.allowed_env))
            for name, command in settings.commands.items()
        }
        self._timings = SessionTimings(
            connect_timeout=settings.connect_timeout_seconds,
            reconnect_min=settings.reconnect_min_seconds,
            reconnect_max=max(settings.reconnect_min_seconds, settings.reconnect_max_seconds),
            list_changed_debounce=settings.list_changed_debounce_seconds,
        )
        self._running: dict[Key, _Running] = {}
        # One cache of output-schema validators for every session's results.
        self._validators = SchemaValidators()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reconciling: set[Key] = set()
        # Every task this manager starts (sessions' owners, the sweep, reconciles) is in this
        # one group, and stop() ends all of them; once closed, nothing new starts.
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # Serialises the decisions that start, replace or stop one connection's session.
        # Dropped when the connection is deleted, so the map holds live names only.
        self._key_locks: dict[Key, asyncio.Lock] = {}
        # Caches for CatalogView, filled on storage threads. Entries are replaced whole.
        self._public: dict[Key, StoredConnection] = {}
        self._tools: dict[Key, tuple[int, tuple[CatalogTool, ...]]] = {}

    # Lifecycle

    async def start(self) -> None:
        """Reconnect every stored connection and start the TTL sweep."""
        self._loop = asyncio.get_running_loop()
        for stored in await self._blocking(self._store.all_connections):
            self._start_session(stored)
        self._spawn(self._sweep_forever(), "mcp-catalog-sweep")

    async def stop(self) -> None:
        """Close (nothing starts after this), stop every session, and end every task this
        manager started: sessions get `_STOP_TIMEOUT` to wind down, then are cancelled."""
        self._closed = True
        running, self._running = list(self._running.values()), {}
        for entry in running:
            entry.session.stop()
        session_tasks = {entry.task for entry in running}
        for task in self._tasks - session_tasks:
            task.cancel()
        await self._await_stopped(list(self._tasks))

    @property
    def closed(self) -> bool:
        return self._closed

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Start a task owned by this manager (see `_tasks`)."""
        if self._closed:
            work.close()
            raise _closed_error()
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _lock(self, key: Key) -> asyncio.Lock:
        lock = self._key_locks.get(key)
        if lock is None:
            lock = self._key_locks[key] = asyncio.Lock()
        return lock

    def _drop_lock(self, key: Key) -> None:
        """After a connection is deleted: its lock goes, unless another caller holds or
        waits for it (that caller then finds the connection gone)."""
        lock = self._key_locks.get(key)
        if lock is not None and not lock.locked():
            del self._key_locks[key]

    async def _await_stopped(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=_STOP_TIMEOUT)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=_STOP_TIMEOUT)

    def _start_session(self, stored: StoredConnection) -> ConnectionSession:
        connection = stored.connection
        key = (connection.tenant, connection.name)

        async def write_catalog(listing: Listing) -> CatalogWrite | None:
            write: CatalogWrite | None = await self._blocking(
                self._store.write_catalog,
                connection.tenant,
                connection.name,
                stored.revision,
                listing.tools,
                rejections(listing.rejected),
            )
            if write is not None and self._on_listed is not None:
                self._on_listed(listing.tools)
            return write

        # The MCP SDK is imported here, with the first session: a sidecar without
        # connections never pays for it.
        from psych_sidecar.mcp.session import ConnectionSession

        keeper = None
        auth = connection.auth
        if auth is not None and auth.kind is not AuthKind.STATIC_HEADERS and self._oauth:
            from psych_sidecar.mcp.oauth.grants import TokenKeeper

            flows, grants = self._flows()

            def keeper(scrub: Scrubber) -> TokenKeeper:
                return TokenKeeper(stored, flows, grants, self._blocking, scrub.add)

        session = ConnectionSession(
            stored, self._commands, self._timings, write_catalog, self._validators, keeper
        )
        task = self._spawn(session.run(), f"mcp-session {connection.name}")
        self._running[key] = _Running(session, task)
        return session

    async def _replace_session(self, stored: StoredConnection) -> ConnectionSession:
        connection = stored.connection
        previous = self._running.pop((connection.tenant, connection.name), None)
        if previous is not None:
            previous.session.stop()
            await self._await_stopped([previous.task])
        return self._start_session(stored)

    async def _stop_session(self, key: Key) -> None:
        previous = self._running.pop(key, None)
        if previous is not None:
            previous.session.stop()
            await self._await_stopped([previous.task])

    # ConnectionService use cases

    async def put_connection(self, connection: Connection) -> tuple[Connection, ConnectionStatus]:
        """Store, connect, list right away; return the state after the first attempt."""
        validate_connection(connection, self.allowed_commands)
        async with self._lock((connection.tenant, connection.name)):
            stored: StoredConnection = await self._blocking(self._store.put_connection, connection)
            session = await self._replace_session(stored)
        await session.wait_attempt(0, self._timings.connect_timeout + 1)
        return await self.describe(connection.tenant, connection.name)

    async def delete_connection(self, tenant: str, name: str) -> None:
        key = (tenant, name)
        async with self._lock(key):
            if not await self._blocking(self._store.delete_connection, tenant, name):
                raise connection_not_found(tenant, name)
            await self._stop_session(key)
            self._forget(key)
        self._drop_lock(key)

    async def describe(self, tenant: str, name: str) -> tuple[Connection, ConnectionStatus]:
        stored: StoredConnection | None = await self._blocking(
            self._store.get_connection, tenant, name
        )
        if stored is None:
            raise connection_not_found(tenant, name)
        return without_secrets(stored.connection), self.status(stored)

    def status(self, stored: StoredConnection) -> ConnectionStatus:
        connection = stored.connection
        status = self._status_of(
            (connection.tenant, connection.name),
            stored.revision,
            stored.catalog_version,
            stored.update_time,
        )
        return dataclasses.replace(status, rejected=stored.rejected)

    def _status_of(
        self, key: Key, revision: int, catalog_version: int, update_time: datetime
    ) -> ConnectionStatus:
        running = self._running.get(key)
        if running is None or running.session.stored.revision != revision:
            # Not running here yet: another sidecar stored it, or it was replaced just now.
            return ConnectionStatus(ConnectionState.CONNECTING, "", update_time, catalog_version)
        status = running.session.status
        keeper = running.session.keeper
        return ConnectionStatus(
            status.state,
            status.last_error,
            status.state_time,
            catalog_version,
            running.session.stderr.text(),
            authorization_reason=status.authorization_reason,
            token_expire_time=keeper.expire_time if keeper is not None else None,
        )

    async def refresh_catalog(self, tenant: str, name: str) -> CatalogWrite:
        """Re-list now. An unreachable server is retried at once; a failure removes nothing."""
        session = await self._session(tenant, name)
        if session is None:
            raise connection_not_found(tenant, name)
        if session.status.state is not ConnectionState.CONNECTED:
            finished = session.finished_attempts
            session.reconnect_now()
            await session.wait_attempt(finished, self._timings.connect_timeout + 1)
        if session.status.authorization_reason is not None:
            raise connection_authorization_required(name, session.status.authorization_reason)
        try:
            return await session.refresh("on_demand")
        except CatalogUnavailable as error:
            detail = _describe(error)
            raise SidecarError(
                Reason.CONNECTION_UNREACHABLE,
                f"could not refresh the catalogue of {name!r}: {detail}; nothing was removed",
                connection=name,
                detail=detail,
            ) from None

    # OAuth sign-in

    def _flows(self) -> tuple[OAuthFlows, OAuthRepository]:
        if self._oauth is None:
            raise RuntimeError("this sidecar was started without OAuth")
        if self._oauth_flows is None:
            from psych_sidecar.mcp.oauth.flows import OAuthFlows

            self._oauth_flows = OAuthFlows(self._oauth[0])
        return self._oauth_flows, self._oauth[1]

    async def begin_sign_in(self, tenant: str, name: str) -> tuple[str, str, datetime]:
        from psych_sidecar.mcp.oauth.flows import step_up_scope

        flows, grants = self._flows()
        stored: StoredConnection | None = await self._blocking(
            self._store.get_connection, tenant, name
        )
        if stored is None:
            raise connection_not_found(tenant, name)
        auth = stored.connection.auth
        if auth is None or auth.kind is not AuthKind.AUTHORIZATION_CODE:
            raise sign_in_not_applicable(name, auth.kind if auth is not None else None)
        grant = await self._blocking(grants.get_grant, tenant, name)
        url, state, pending = await flows.begin(
            stored, grant.client_json if grant is not None else None, step_up_scope(grant)
        )
        await self._blocking(grants.save_sign_in, pending)
        return url, state, pending.expire_time

    async def complete_sign_in(
        self, tenant: str, state: str, code: str, name: str
    ) -> tuple[Connection, ConnectionStatus]:
        from psych_sidecar.mcp.oauth.flows import TokenRefused, state_digest

        flows, grants = self._flows()
        now = datetime.now(UTC)

        def check(pending: PendingSignIn, revision: int | None) -> None:
            # The tenant first: another tenant learns nothing of the sign-in, not even
            # whether it was used or expired, and spends nothing.
            if pending.tenant != tenant:
                raise SidecarError(
                    Reason.SIGN_IN_STATE_WRONG_TENANT,
                    f"the state was not issued to tenant {short(tenant)!r}",
                    tenant=short(tenant),
                )
            if pending.used_time is not None:
                raise SidecarError(
                    Reason.SIGN_IN_STATE_USED,
                    f"the state of this sign-in to {pending.name!r} was already used; begin again",
                    tenant=short(tenant),
                    connection=pending.name,
                )
            if pending.expire_time <= now:
                expired = pending.expire_time.strftime("%Y-%m-%dT%H:%M:%SZ")
                raise SidecarError(
                    Reason.SIGN_IN_STATE_EXPIRED,
                    f"the sign-in to {pending.name!r} expired at {expired}; begin again",
                    tenant=short(tenant),
                    connection=pending.name,
                    expire_time=expired,
                )
            detail = ""
            if name and name != pending.name:
                detail = (
                    f"the state was issued for connection {pending.name!r}, not {short(name)!r}"
                )
            elif revision is None:
                detail = f"connection {pending.name!r} was deleted since the sign-in began"
            elif revision != pending.revision:
                detail = f"connection {pending.name!r} was replaced since the sign-in began"
            if detail:
                raise SidecarError(
                    Reason.SIGN_IN_STATE_MISMATCH,
                    detail,
                    tenant=short(tenant),
                    connection=pending.name,
                    detail=detail,
                )

        pending: PendingSignIn | None = await self._blocking(
            grants.spend_sign_in, state_digest(state), check
        )
        if pending is None:
            raise SidecarError(
                Reason.SIGN_IN_STATE_UNKNOWN,
                "no sign-in with this state: it was never begun, or was removed long after it "
                "expired",
                tenant=short(tenant),
            )
        key = (tenant, pending.name)
        stored: StoredConnection | None = await self._blocking(self._store.get_connection, *key)
        if stored is None or stored.revision != pending.revision:
            raise SidecarError(
                Reason.SIGN_IN_STATE_MISMATCH,
                f"connection {pending.name!r} changed during the sign-in",
                tenant=short(tenant),
                connection=pending.name,
                detail="the connection changed during the sign-in",
            )
        try:
            grant = await flows.complete(stored.connection, pending, code)
        except TokenRefused as refused:
            raise SidecarError(
                Reason.OAUTH_GRANT_REFUSED,
                f"connection {pending.name!r}: the authorization server refused the code: "
                f"{refused}; begin again",
                connection=pending.name,
                detail=str(refused),
            ) from None
        await self._blocking(grants.put_grant, *key, grant)
        async with self._lock(key):
            session = await self._replace_session(stored)
        await session.wait_attempt(0, self._timings.connect_timeout + 1)
        return await self.describe(*key)

    async def _session(self, tenant: str, name: str) -> ConnectionSession | None:
        """The session for a stored connection, started here if another sidecar stored it."""
        if self._closed:
            raise _closed_error()
        key = (tenant, name)
        async with self._lock(key):
            stored: StoredConnection | None = await self._blocking(
                self._store.get_connection, tenant, name
            )
            running = self._running.get(key)
            if stored is not None:
                if running is not None and running.session.stored.revision == stored.revision:
                    return running.session
                return await self._replace_session(stored)
            if running is not None:
                await self._stop_session(key)
                self._forget(key)
        self._drop_lock(key)
        return None

    # The background sweep: TTL refreshes, and catching up with other sidecars' changes.

    async def _sweep_forever(self) -> None:
        interval = self._settings.catalog_ttl_seconds / _SWEEPS_PER_TTL
        while True:
            await asyncio.sleep(interval)
            try:
                await self._sweep()
            except Exception:
                log.exception("MCP catalogue sweep failed; retrying at the next one")

    async def _sweep(self) -> None:
        stored_all: list[StoredConnection] = await self._blocking(self._store.all_connections)
        wanted = {(s.connection.tenant, s.connection.name): s for s in stored_all}
        for key in [key for key in self._running if key not in wanted]:
            await self._session(*key)
        for key, stored in wanted.items():
            running = self._running.get(key)
            if running is None or running.session.stored.revision != stored.revision:
                await self._session(*key)
        due = anyio.current_time() - self._settings.catalog_ttl_seconds
        for running in list(self._running.values()):
            session = running.session
            if session.status.state is ConnectionState.CONNECTED and session.last_refresh <= due:
                try:
                    await session.refresh("ttl")
                except CatalogUnavailable as error:
                    log.warning(
                        "MCP connection %s/%s: TTL refresh failed: %s",
                        *session.key,
                        _describe(error),
                    )

    def _forget(self, key: Key) -> None:
        self._public.pop(key, None)
        self._tools.pop(key, None)

    # For the metrics scrape (on the loop). Connections are labelled by name only: the same
    # name in several tenants adds up.

    def connection_states(self) -> list[tuple[str, str]]:
        return [
            (running.session.stored.connection.name, running.session.status.state.name)
            for running in list(self._running.values())
        ]

    def catalog_sizes(self) -> list[tuple[str, int]]:
        sizes: dict[str, int] = {}
        for running in list(self._running.values()):
            name = running.session.stored.connection.name
            sizes[name] = sizes.get(name, 0) + running.session.catalog_size
        return sorted(sizes.items())

    # CatalogView (synchronous; storage threads)

    def tenant_connections(self, tenant: str) -> list[tuple[Connection, ConnectionStatus]]:
        versions = self._store.connection_versions(tenant)
        listed: list[tuple[Connection, ConnectionStatus]] = []
        for name in sorted(versions):
            revision, catalog_version = versions[name]
            key = (tenant, name)
            cached = self._public.get(key)
            if cached is None or cached.revision != revision:
                stored = self._store.get_connection(tenant, name)
                if stored is None:
                    continue
                cached = dataclasses.replace(stored, connection=without_secrets(stored.connection))
                self._public[key] = cached
            status = self._status_of(key, revision, catalog_version, cached.update_time)
            if status.state is ConnectionState.CONNECTING and self._session_lags(key, revision):
                # Stored or replaced by another sidecar: have this one catch up.
                self._reconcile_soon(key)
            listed.append((cached.connection, status))
        return listed

    def _session_lags(self, key: Key, revision: int) -> bool:
        running = self._running.get(key)
        return running is None or running.session.stored.revision != revision

    def _reconcile_soon(self, key: Key) -> None:
        loop = self._loop
        if loop is None or self._closed or key in self._reconciling:
            return
        self._reconciling.add(key)

        async def run() -> None:
            try:
                await self._session(*key)
            except Exception:
                if not self._closed:
                    log.exception("starting the session of %s/%s failed", *key)
            finally:
                self._reconciling.discard(key)

        def reconcile() -> None:
            # Runs on the loop, perhaps after stop(): then nothing starts.
            if self._closed:
                self._reconciling.discard(key)
                return
            self._spawn(run(), f"mcp-reconcile {key[1]}")

        loop.call_soon_threadsafe(reconcile)

    def current_tools(self, tenant: str, server: str, version: int = 0) -> list[CatalogTool]:
        """The tools of catalogue `version` (0: the newest). The caller names the version it
        read with the connection, so the tools always belong to it: no shared "last seen
        version" that another storage thread could overwrite with an older read meanwhile."""
        key = (tenant, server)
        cached = self._tools.get(key)
        if cached is not None and version and cached[0] == version:
            return list(cached[1])
        read = self._store.catalog_tools(tenant, server, version)
        if read is None:
            return []
        read_version, tools = read
        # Only ever replaced by a newer version: an older read landing late does not evict it.
        if cached is None or read_version >= cached[0]:
            self._tools[key] = (read_version, tuple(tools))
        return tools

    # ToolRunner

    async def call_tool(
        self,
        tenant: str,
        server: str,
        tool: str,
        arguments: Mapping[str, object],
        timeout_seconds: float,
    ) -> McpToolResult:
        running = self._running.get((tenant, server))
        session = running.session if running is not None else await self._session(tenant, server)
        if session is None:
            metrics.record_tool_call(server, "refused", 0.0)
            raise ToolCallFailed(f"There is no MCP server named {server!r}.")
        return await session.call_tool(tool, arguments, timeout_seconds)


def _describe(error: BaseException) -> str:
    """One line for a session's failure (only a running session raises CatalogUnavailable, so
    the SDK is already imported)."""
    from psych_sidecar.mcp.session import describe_error

    return describe_error(error)

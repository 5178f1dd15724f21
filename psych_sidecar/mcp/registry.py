"""The sessions of this sidecar: one owned session per stored connection, the tasks that run
them, and the background sweep (TTL refreshes, catching up with other sidecars' changes).

The domain's ports are implemented beside it, over this one registry: `catalog_view.py`
(CatalogView), `supervisor.py` (ConnectionSupervisor), `tool_runner.py` (ToolRunner) and
`task_runner.py` (TaskRunner), the last two on `SessionPort` below, with OAuth sign-in in
`sign_in.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime
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
    Scrubber,
    StoredConnection,
    ToolCallFailed,
    connection_not_found,
    rejections,
    without_secrets,
)
from psych_sidecar.domain.errors import ConnectionUnreachable
from psych_sidecar.domain.runlog import OffLoop
from psych_sidecar.mcp.session_types import CatalogUnavailable, Listing, SessionTimings

if TYPE_CHECKING:
    import mcp_types

    from psych_sidecar.mcp.oauth.flows import OAuthFlows
    from psych_sidecar.mcp.oauth.grants import TokenKeeper
    from psych_sidecar.mcp.session import ConnectionSession

log = logging.getLogger(__name__)

Key = tuple[str, str]

# Stopping a session waits this long for its owner task (a stdio server gets ~4 s to exit).
_STOP_TIMEOUT = 10.0
# The sweep wakes this many times per TTL, so no catalogue is older than about 1.25 TTL.
_SWEEPS_PER_TTL = 4


def _closed_error(connection: str) -> ConnectionUnreachable:
    return ConnectionUnreachable(
        "the sidecar is shutting down: no MCP session starts any more",
        connection=connection,
        detail="shutting down",
    )


def describe(error: BaseException) -> str:
    """One line for a session's failure (only a running session raises CatalogUnavailable, so
    the SDK is already imported)."""
    from psych_sidecar.mcp.session_state import describe_error

    return describe_error(error)


@dataclasses.dataclass(slots=True)
class _Running:
    session: ConnectionSession
    task: asyncio.Task[None]


class SessionRegistry:
    """Owns one session per stored connection, and every task it starts.

    Async methods run on the server's event loop; `status_of`, `session_lags` and
    `reconcile_soon` are also called from storage threads (by the CatalogView), and ask the
    loop thread-safely to start sessions for connections another sidecar stored.
    """

    def __init__(
        self,
        *,
        store: ConnectionRepository,
        blocking: OffLoop,
        settings: McpSettings,
        on_listed: Callable[[Sequence[CatalogTool]], None] | None = None,
        oauth: tuple[OAuthOutboundSettings, OAuthRepository] | None = None,
        convert_result: Callable[[mcp_types.CallToolResult], McpToolResult] | None = None,
    ):
        """`on_listed` is told every listing this sidecar stores (on the loop: it must not
        block); the server uses it to encode new tools for search ahead of the first search.
        `oauth`: the OAuth requests' settings and the grants' storage (without them, OAuth
        connections stay AUTHORIZATION_REQUIRED). `convert_result`: how a tool result becomes
        what the log keeps (tests pass one that fails; None: `result_parts.tool_result`)."""
        self.store = store
        self.blocking = blocking
        self._oauth = oauth
        # Made with the first OAuth need: the module imports the MCP SDK's auth client.
        self._oauth_flows: OAuthFlows | None = None
        self._on_listed = on_listed
        self._settings = settings
        self._convert_result = convert_result
        self.allowed_commands: Mapping[str, AllowedCommand] = {
            name: AllowedCommand(command.allow_extra_args, tuple(command.allowed_env))
            for name, command in settings.commands.items()
        }
        self.timings = SessionTimings(
            connect_timeout=settings.connect_timeout_seconds,
            reconnect_min=settings.reconnect_min_seconds,
            reconnect_max=max(settings.reconnect_min_seconds, settings.reconnect_max_seconds),
            list_changed_debounce=settings.list_changed_debounce_seconds,
            catalog_ttl=settings.catalog_ttl_seconds,
            min_list_ttl=settings.min_list_ttl_seconds,
            input_wait=settings.input_wait_seconds,
            max_held_calls=settings.max_held_calls,
        )
        self._running: dict[Key, _Running] = {}
        # One cache of output-schema validators for every session's results.
        self._validators = SchemaValidators()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reconciling: set[Key] = set()
        # Every task this registry starts (sessions' owners, the sweep, reconciles) is in this
        # one group, and stop() ends all of them; once closed, nothing new starts.
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # Serialises the decisions that start, replace or stop one connection's session.
        # Dropped when the connection is deleted, so the map holds live names only.
        self._key_locks: dict[Key, asyncio.Lock] = {}
        # Told of each connection found deleted, to drop what they keep of it.
        self._forgetting: list[Callable[[Key], None]] = []

    # Lifecycle

    async def start(self) -> None:
        """Reconnect every stored connection and start the TTL sweep."""
        self._loop = asyncio.get_running_loop()
        for stored in await self.blocking(self.store.all_connections):
            self._start_session(stored)
        self._spawn(self._sweep_forever(), "mcp-catalog-sweep")

    async def stop(self) -> None:
        """Close (nothing starts after this), stop every session, and end every task this
        registry started: sessions get `_STOP_TIMEOUT` to wind down, then are cancelled."""
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
        """Start a task owned by this registry (see `_tasks`)."""
        if self._closed:
            work.close()
            raise _closed_error(name)
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def lock(self, key: Key) -> asyncio.Lock:
        """The lock of one connection's start, replace and stop decisions."""
        lock = self._key_locks.get(key)
        if lock is None:
            lock = self._key_locks[key] = asyncio.Lock()
        return lock

    def drop_lock(self, key: Key) -> None:
        """After a connection is deleted: its lock goes, unless another caller holds or
        waits for it (that caller then finds the connection gone)."""
        lock = self._key_locks.get(key)
        if lock is not None and not lock.locked():
            del self._key_locks[key]

    def on_forget(self, forget: Callable[[Key], None]) -> None:
        """Have `forget` told of each connection found deleted."""
        self._forgetting.append(forget)

    def forget(self, key: Key) -> None:
        for forget in self._forgetting:
            forget(key)

    async def _await_stopped(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=_STOP_TIMEOUT)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=_STOP_TIMEOUT)

    # Sessions

    def oauth_flows(self) -> tuple[OAuthFlows, OAuthRepository]:
        """The OAuth flows (made at the first need) and the grants' storage."""
        if self._oauth is None:
            raise RuntimeError("this sidecar was started without OAuth")
        if self._oauth_flows is None:
            from psych_sidecar.mcp.oauth.flows import OAuthFlows

            self._oauth_flows = OAuthFlows(self._oauth[0])
        return self._oauth_flows, self._oauth[1]

    def _start_session(self, stored: StoredConnection) -> ConnectionSession:
        connection = stored.connection
        key = (connection.tenant, connection.name)

        async def write_catalog(listing: Listing) -> CatalogWrite | None:
            write: CatalogWrite | None = await self.blocking(
                self.store.write_catalog,
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

            flows, grants = self.oauth_flows()

            def keeper(scrub: Scrubber) -> TokenKeeper:
                return TokenKeeper(
                    stored=stored,
                    flows=flows,
                    store=grants,
                    blocking=self.blocking,
                    on_token=scrub.add,
                )

        session = ConnectionSession(
            stored=stored,
            commands=self._settings.commands,
            timings=self.timings,
            write_catalog=write_catalog,
            validators=self._validators,
            keeper=keeper,
            max_line_bytes=self._settings.stdio_max_line_bytes,
            convert_result=self._convert_result,
        )
        task = self._spawn(session.run(), f"mcp-session {connection.name}")
        self._running[key] = _Running(session, task)
        return session

    async def replace_session(self, stored: StoredConnection) -> ConnectionSession:
        """Stop the connection's session, if any, and start one for `stored` (under its
        `lock`)."""
        connection = stored.connection
        await self.stop_session((connection.tenant, connection.name))
        return self._start_session(stored)

    async def stop_session(self, key: Key) -> None:
        previous = self._running.pop(key, None)
        if previous is not None:
            previous.session.stop()
            await self._await_stopped([previous.task])

    def running_session(self, tenant: str, name: str) -> ConnectionSession | None:
        """The session running here for the connection, whatever its revision."""
        running = self._running.get((tenant, name))
        return running.session if running is not None else None

    async def running_or_stored_session(self, tenant: str, name: str) -> ConnectionSession | None:
        """The session running here, without reading the store (a call's fast path); else the
        stored connection's, started now (another sidecar stored it); None when there is no
        such connection."""
        running = self.running_session(tenant, name)
        return running if running is not None else await self.session(tenant, name)

    async def session(self, tenant: str, name: str) -> ConnectionSession | None:
        """The session for a stored connection, started here if another sidecar stored it."""
        if self._closed:
            raise _closed_error(name)
        key = (tenant, name)
        async with self.lock(key):
            stored: StoredConnection | None = await self.blocking(
                self.store.get_connection, tenant, name
            )
            running = self._running.get(key)
            if stored is not None:
                if running is not None and running.session.state.stored.revision == stored.revision:
                    return running.session
                return await self.replace_session(stored)
            if running is not None:
                await self.stop_session(key)
                self.forget(key)
        self.drop_lock(key)
        return None

    async def first_attempt(self, session: ConnectionSession) -> None:
        """Wait for a new session's first connection attempt to end (or time out)."""
        await session.state.wait_attempt(0, self.timings.connect_timeout + 1)

    # States

    async def describe(self, tenant: str, name: str) -> tuple[Connection, ConnectionStatus]:
        """The stored connection (secrets emptied) and its state here."""
        stored: StoredConnection | None = await self.blocking(
            self.store.get_connection, tenant, name
        )
        if stored is None:
            raise connection_not_found(tenant, name)
        return without_secrets(stored.connection), self.status(stored)

    def status(self, stored: StoredConnection) -> ConnectionStatus:
        connection = stored.connection
        status = self.status_of(
            (connection.tenant, connection.name),
            stored.revision,
            stored.catalog_version,
            stored.update_time,
        )
        return dataclasses.replace(status, rejected=stored.rejected)

    def status_of(
        self, key: Key, revision: int, catalog_version: int, update_time: datetime
    ) -> ConnectionStatus:
        running = self._running.get(key)
        if running is None or running.session.state.stored.revision != revision:
            # Not running here yet: another sidecar stored it, or it was replaced just now.
            return ConnectionStatus(ConnectionState.CONNECTING, "", update_time, catalog_version)
        state = running.session.state
        status = state.status
        keeper = state.keeper
        return ConnectionStatus(
            status.state,
            status.last_error,
            status.state_time,
            catalog_version,
            state.stderr.text(),
            authorization_reason=status.authorization_reason,
            token_expire_time=keeper.expire_time if keeper is not None else None,
        )

    def session_lags(self, key: Key, revision: int) -> bool:
        """Whether no session of this revision runs here."""
        running = self._running.get(key)
        return running is None or running.session.state.stored.revision != revision

    def reconcile_soon(self, key: Key) -> None:
        """From any thread: have the loop start (or stop) the connection's session to match
        what is stored."""
        loop = self._loop
        if loop is None or self._closed or key in self._reconciling:
            return
        self._reconciling.add(key)

        async def run() -> None:
            try:
                await self.session(*key)
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
        stored_all: list[StoredConnection] = await self.blocking(self.store.all_connections)
        wanted = {(s.connection.tenant, s.connection.name): s for s in stored_all}
        for key in [key for key in self._running if key not in wanted]:
            await self.session(*key)
        for key, stored in wanted.items():
            if self.session_lags(key, stored.revision):
                await self.session(*key)
        due = anyio.current_time() - self._settings.catalog_ttl_seconds
        for running in list(self._running.values()):
            session = running.session
            if (
                session.state.status.state is ConnectionState.CONNECTED
                and session.catalog.last_refresh <= due
            ):
                try:
                    await session.catalog.refresh("ttl")
                except CatalogUnavailable as error:
                    log.warning(
                        "MCP connection %s/%s: TTL refresh failed: %s",
                        *session.state.key,
                        describe(error),
                    )

    # For the metrics scrape (on the loop). Connections are labelled by name only: the same
    # name in several tenants adds up.

    def connection_states(self) -> list[tuple[str, str]]:
        return [
            (running.session.state.stored.connection.name, running.session.state.status.state.name)
            for running in list(self._running.values())
        ]

    def catalog_sizes(self) -> list[tuple[str, int]]:
        sizes: dict[str, int] = {}
        for running in list(self._running.values()):
            name = running.session.state.stored.connection.name
            sizes[name] = sizes.get(name, 0) + running.session.catalog.catalog_size
        return sorted(sizes.items())


class SessionPort:
    """A domain port whose requests go to one connection's live session, found in `sessions`
    by (tenant, server). Runs on the server's event loop."""

    def __init__(self, sessions: SessionRegistry) -> None:
        self._sessions = sessions

    async def _session(self, tenant: str, server: str) -> ConnectionSession:
        session = await self._sessions.running_or_stored_session(tenant, server)
        if session is None:
            self._no_such_server(server)
            raise ToolCallFailed(f"There is no MCP server named {server!r}.")
        return session

    def _no_such_server(self, server: str) -> None:
        """Told of a request naming no server this tenant has, before it is refused."""

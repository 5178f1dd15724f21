"""What the catalogue concern needs from outside the domain: the MCP
layer implements :class:`ConnectionSupervisor`, :class:`CatalogView` and :class:`ToolRunner`
(one class each, over the MCP layer's session registry); storage implements
:class:`ConnectionRepository`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

from psych_sidecar.domain.catalog.connections import (
    NO_REJECTIONS,
    CatalogTool,
    Connection,
    ConnectionStatus,
    McpToolRequest,
    McpToolResult,
    Rejections,
)
from psych_sidecar.domain.catalog.input_requests import InputAnswer, InputAsked
from psych_sidecar.domain.catalog.oauth import OAuthGrant, PendingSignIn, RefreshClaim
from psych_sidecar.domain.catalog.rules import CatalogVersion, CatalogWrite, StoredConnection


class CatalogView(Protocol):
    """Reads of connections and current catalogues, for resolving a turn. Synchronous."""

    def tenant_connections(self, tenant: str) -> list[tuple[Connection, ConnectionStatus]]:
        """Every connection of the tenant (secrets emptied), sorted by name."""
        ...

    def tenant_connections_now(
        self, tenant: str, versions: dict[str, tuple[int, int]]
    ) -> list[tuple[Connection, ConnectionStatus]] | None:
        """`tenant_connections` for the connection versions given (read by the caller, see
        `ConnectionRepository.connection_versions`) from memory alone, on the event loop;
        None when one of them is not in memory at its revision."""
        ...

    def current_tools(self, tenant: str, server: str, version: int = 0) -> list[CatalogTool]:
        """The tools of catalogue version `version` — the one `tenant_connections` reported —
        or of the newest (removed_in_version == 0) for 0, sorted by name; the last known tools
        when the server is unreachable."""
        ...


class ToolRunner(Protocol):
    """Executes one tool on a live session. Asynchronous: runs on the server's event loop."""

    async def call_tool(
        self, request: McpToolRequest, timeout_seconds: float
    ) -> McpToolResult | InputAsked:
        """The result, or the server's questions when it asked before answering (see
        `continue_tool`). Raises ToolCallFailed when no result came back (unreachable,
        timeout, closed)."""
        ...

    async def continue_tool(
        self,
        request: McpToolRequest,
        *,
        asked: InputAsked,
        answers: Sequence[InputAnswer],
        timeout_seconds: float,
    ) -> McpToolResult | InputAsked:
        """A call that asked (`asked`) continued with the user's answers: repeated with them
        and the echoed request state on a stateless revision; on 2025-11-25 the answer is
        given to the question held open in its session. Raises ToolCallFailed as
        `call_tool` does, and when the held question is gone (its session ended)."""
        ...

    async def unreachable(self, tenant: str, server: str, timeout_seconds: float) -> str | None:
        """Why the server cannot be reached just now through this sidecar's session (still
        connecting, or unreachable), after waiting for it within the timeout; None when a
        call may go on (connected, or stopped by something lasting that the call reports)."""
        ...


class ConnectionSupervisor(Protocol):
    """What the connection use cases need of the MCP layer: it owns the sessions, so
    putting, deleting and refreshing a connection go through it."""

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

    async def begin_sign_in(self, tenant: str, name: str) -> tuple[str, str, datetime]:
        """Start an OAuth sign-in: (authorization URL, state, when the state expires)."""
        ...

    async def complete_sign_in(
        self, tenant: str, state: str, code: str, name: str, *, iss: str | None
    ) -> tuple[Connection, ConnectionStatus]:
        """Check the redirect's `iss` (None: it had none), exchange its code, store the
        tokens, connect; the state after that."""
        ...


class OAuthRepository(Protocol):
    """OAuth grants and begun sign-ins in storage, their secrets sealed. Each method is one
    transaction."""

    def save_sign_in(self, pending: PendingSignIn) -> None: ...

    def spend_sign_in(
        self, state_digest: str, check: Callable[[PendingSignIn, int | None], None]
    ) -> PendingSignIn | None:
        """Mark the sign-in used and return it (None: no such state). `check` sees it and the
        connection's current revision (None: deleted) first, and refuses by raising."""
        ...

    def get_grant(self, tenant: str, name: str) -> OAuthGrant | None: ...

    def put_grant(self, tenant: str, name: str, grant: OAuthGrant) -> None:
        """Store a new grant (a sign-in's, a first client-credentials one); a refresh claim
        on the one it replaces ends."""
        ...

    def renew_grant(
        self, tenant: str, name: str, renew: Callable[[OAuthGrant], OAuthGrant]
    ) -> OAuthGrant | None:
        """With the grant's row locked and read again, store `renew(grant)` (unless it is the
        grant itself); None when there is no grant. `renew` makes no request: the lock is
        held while it runs."""
        ...

    def claim_refresh(
        self,
        tenant: str,
        name: str,
        claimant: str,
        claim_seconds: float,
        needs_refresh: Callable[[OAuthGrant], bool],
    ) -> RefreshClaim | None:
        """The grant read again and, when `needs_refresh` says so and no other claimant's
        claim is live, its refresh claimed for `claimant` for `claim_seconds`; None when there
        is no grant. A short transaction: the token request is made after it."""
        ...

    def store_refreshed(
        self, tenant: str, name: str, claimant: str, grant: OAuthGrant
    ) -> OAuthGrant | None:
        """Store the refreshed `grant` and end the claim if `claimant` still holds it (then
        `grant` itself is returned); else the grant as it stands (a new sign-in replaced it,
        or the claim expired and another took it), None when there is none."""
        ...

    def release_refresh(self, tenant: str, name: str, claimant: str) -> None:
        """End `claimant`'s claim, storing nothing (its refresh failed)."""
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
        self,
        tenant: str,
        server: str,
        revision: int,
        tools: Sequence[CatalogTool],
        rejected: Rejections = NO_REJECTIONS,
    ) -> CatalogWrite | None:
        """Record one complete listing made by a session of that revision (its valid tools,
        and what it left out); None when the connection is gone or was replaced since (a
        stale session must not write)."""
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

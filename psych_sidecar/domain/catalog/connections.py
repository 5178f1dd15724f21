"""MCP connections and their versioned catalogues, as the rest of the domain sees them.

This module is the seam between two parts of psych-sidecar:

- the MCP layer (sessions, owner tasks, transports, catalogue refresh), which implements
  `CatalogView`, `ToolRunner` and `ConnectionSupervisor` (catalog/ports.py);
- the tool surface (narrowing, ResolveTurn, CallDeferredTool, dispatch, search), which uses
  them and never touches an MCP session or SQL directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from psych_sidecar.domain.catalog.oauth import AuthorizationReason, OAuthSettings
from psych_sidecar.domain.runlog import ContentPart

# A connection's description is capped in its prompt line.
DESCRIPTION_PROMPT_CHARS = 200


class TransportKind(StrEnum):
    STDIO = "stdio"
    STREAMABLE_HTTP = "streamable_http"
    SSE = "sse"


class ConnectionState(StrEnum):
    CONNECTING = "connecting"
    CONNECTED = "connected"
    UNREACHABLE = "unreachable"
    # OAuth: nobody signed in, or the tokens were refused (ConnectionStatus says why).
    AUTHORIZATION_REQUIRED = "authorization_required"


@dataclass(frozen=True, slots=True)
class Connection:
    """A tenant's MCP connection as put through the API. `env` and `headers` are secrets:
    never returned, never logged (their repr is suppressed)."""

    tenant: str
    name: str
    transport: TransportKind
    # stdio: the name of an operator-allowed command, plus extra args if that entry allows.
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    # HTTP transports.
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    # HTTP transports: OAuth, or None for the headers alone.
    auth: OAuthSettings | None = None
    # None: decided each turn from the permitted catalogue size.
    preload: bool | None = None
    eager_tools: tuple[str, ...] = ()
    description: str = ""
    allow_tools: tuple[str, ...] = ()
    deny_tools: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RejectedTool:
    """A tool of a server's listing left out of the catalogue: its definition is invalid
    (`reason` says how). `name` is as listed, cut short; "" when the entry had none."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class Rejections:
    """The tools a catalogue version's listing had and the catalogue left out: the first
    few with their reasons, and how many there were in all."""

    tools: tuple[RejectedTool, ...] = ()
    count: int = 0


NO_REJECTIONS = Rejections()


@dataclass(frozen=True, slots=True)
class ConnectionStatus:
    state: ConnectionState
    last_error: str
    state_time: datetime
    # The newest catalogue version; 0 before the first successful listing.
    catalog_version: int
    # The tail of a stdio server's stderr, secrets scrubbed; "" when none.
    recent_output: str = ""
    # The tools the newest version's listing had and left out.
    rejected: Rejections = NO_REJECTIONS
    # Why it is AUTHORIZATION_REQUIRED; None in every other state.
    authorization_reason: AuthorizationReason | None = None
    # When its OAuth access token expires; None without one.
    token_expire_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class CatalogTool:
    """One tool of a connection's catalogue at one version. Schemas are the server's JSON,
    byte for byte."""

    server: str
    name: str
    description: str
    input_schema_json: bytes
    output_schema_json: bytes = b""
    annotations_json: bytes = b""
    catalog_version: int = 0
    # The version that first no longer had the tool; 0 while it is current.
    removed_in_version: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class McpToolRequest:
    """One call of an MCP tool: which tool of which of the tenant's connections, with which
    arguments (sent as given)."""

    tenant: str
    server: str
    tool: str
    arguments: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class McpToolResult:
    """A tools/call result: `result_json` is the MCP CallToolResult as JSON, and `content`
    the same content as log parts (text, JSON, binary with MIME type)."""

    is_error: bool
    result_json: bytes
    content: tuple[ContentPart, ...]


class ToolCallFailed(Exception):
    """A call that reached no result: the server is unreachable, timed out or died.
    The message is written for the model, which gets it as a tool error; `authorization`
    says why, when it is that the connection needs authorizing (for the host to act on)."""

    def __init__(self, message: str, authorization: AuthorizationReason | None = None) -> None:
        super().__init__(message)
        self.authorization = authorization

"""MCP connections and their versioned, soft-delete catalogues, and narrowing.

Owns what a connection is (transport, operator-allowed commands, secrets), the catalogue's
versions and their diff, and narrowing: which of a connection's tools a Run may reach (the
not-removed catalogue, the connection's allow/deny lists, the Spec's grant and the Run's
restrictions). The MCP layer implements :class:`CatalogView` and :class:`ToolRunner`; storage
implements :class:`ConnectionRepository`.
"""

from __future__ import annotations

from psych_sidecar.domain.catalog.connections import (
    DESCRIPTION_PROMPT_CHARS,
    NO_REJECTIONS,
    CatalogTool,
    Connection,
    ConnectionState,
    ConnectionStatus,
    McpToolRequest,
    McpToolResult,
    RejectedTool,
    Rejections,
    ToolCallFailed,
    TransportKind,
)
from psych_sidecar.domain.catalog.input_requests import (
    STATELESS_REVISIONS,
    InputAction,
    InputAnswer,
    InputAsked,
    InputMode,
    InputRequest,
    content_problem,
    with_defaults,
)
from psych_sidecar.domain.catalog.input_waits import (
    CallRounds,
    InputWait,
    InputWaits,
    RoundOutcome,
    answers_json,
    new_attempt,
)
from psych_sidecar.domain.catalog.narrowing import Grants, glob_match
from psych_sidecar.domain.catalog.oauth import (
    AuthKind,
    AuthorizationReason,
    ClientKind,
    OAuthGrant,
    OAuthSettings,
    PendingSignIn,
    RefreshClaim,
    authorization_line,
    connection_authorization_required,
    sign_in_not_applicable,
)
from psych_sidecar.domain.catalog.ports import (
    CatalogView,
    ConnectionRepository,
    ConnectionSupervisor,
    OAuthRepository,
    ToolRunner,
)
from psych_sidecar.domain.catalog.rules import (
    AllowedCommand,
    CatalogDiff,
    CatalogVersion,
    CatalogWrite,
    StoredConnection,
    catalog_version_not_found,
    connection_not_found,
    diff_catalog,
    env_name_allowed,
    listing_fingerprint,
    rejected_tool,
    rejections,
    risky_env_name,
    tool_definition_problem,
    validate_connection,
    validate_connection_name,
)
from psych_sidecar.domain.catalog.secrets import (
    REDACTED,
    Scrubber,
    redact_url,
    without_secrets,
)
from psych_sidecar.domain.catalog.service import ConnectionService
from psych_sidecar.domain.catalog.urls import MAX_URL_CHARS, http_url_problem

__all__ = [
    "DESCRIPTION_PROMPT_CHARS",
    "MAX_URL_CHARS",
    "NO_REJECTIONS",
    "REDACTED",
    "STATELESS_REVISIONS",
    "AllowedCommand",
    "AuthKind",
    "AuthorizationReason",
    "CallRounds",
    "CatalogDiff",
    "CatalogTool",
    "CatalogVersion",
    "CatalogView",
    "CatalogWrite",
    "ClientKind",
    "Connection",
    "ConnectionRepository",
    "ConnectionService",
    "ConnectionState",
    "ConnectionStatus",
    "ConnectionSupervisor",
    "Grants",
    "InputAction",
    "InputAnswer",
    "InputAsked",
    "InputMode",
    "InputRequest",
    "InputWait",
    "InputWaits",
    "McpToolRequest",
    "McpToolResult",
    "OAuthGrant",
    "OAuthRepository",
    "OAuthSettings",
    "PendingSignIn",
    "RefreshClaim",
    "RejectedTool",
    "Rejections",
    "RoundOutcome",
    "Scrubber",
    "StoredConnection",
    "ToolCallFailed",
    "ToolRunner",
    "TransportKind",
    "answers_json",
    "authorization_line",
    "catalog_version_not_found",
    "connection_authorization_required",
    "connection_not_found",
    "content_problem",
    "diff_catalog",
    "env_name_allowed",
    "glob_match",
    "http_url_problem",
    "listing_fingerprint",
    "new_attempt",
    "redact_url",
    "rejected_tool",
    "rejections",
    "risky_env_name",
    "sign_in_not_applicable",
    "tool_definition_problem",
    "validate_connection",
    "validate_connection_name",
    "with_defaults",
    "without_secrets",
]

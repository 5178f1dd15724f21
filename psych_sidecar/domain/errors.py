"""Typed domain errors. Each carries one reason from the contract's ErrorReason catalogue."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar, dataclass_transform


class Reason(StrEnum):
    """Mirrors psych.sidecar.v1.ErrorReason, without the ERROR_REASON_ prefix.

    A test checks that the two lists stay identical.
    """

    FIELD_REQUIRED = "FIELD_REQUIRED"
    FIELD_INVALID = "FIELD_INVALID"
    SPEC_THRESHOLDS_CONTRADICT = "SPEC_THRESHOLDS_CONTRADICT"
    SPEC_NOT_FOUND = "SPEC_NOT_FOUND"
    SPEC_VERSION_EXISTS = "SPEC_VERSION_EXISTS"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    REQUEST_ID_REUSED = "REQUEST_ID_REUSED"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    INVALID_DEFERRED_HANDLE = "INVALID_DEFERRED_HANDLE"
    CONNECTION_NOT_FOUND = "CONNECTION_NOT_FOUND"
    COMMAND_NOT_ALLOWED = "COMMAND_NOT_ALLOWED"
    CATALOG_VERSION_NOT_FOUND = "CATALOG_VERSION_NOT_FOUND"
    CONNECTION_UNREACHABLE = "CONNECTION_UNREACHABLE"
    PATTERN_INVALID = "PATTERN_INVALID"
    PATTERN_TOO_COMPLEX = "PATTERN_TOO_COMPLEX"
    NOT_IMPLEMENTED = "NOT_IMPLEMENTED"
    INTERNAL = "INTERNAL"
    STORAGE_UNAVAILABLE = "STORAGE_UNAVAILABLE"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    CONTEXT_BUDGET_EXCEEDED = "CONTEXT_BUDGET_EXCEEDED"
    SIGN_IN_STATE_UNKNOWN = "SIGN_IN_STATE_UNKNOWN"
    SIGN_IN_STATE_USED = "SIGN_IN_STATE_USED"
    SIGN_IN_STATE_EXPIRED = "SIGN_IN_STATE_EXPIRED"
    SIGN_IN_STATE_WRONG_TENANT = "SIGN_IN_STATE_WRONG_TENANT"
    SIGN_IN_STATE_MISMATCH = "SIGN_IN_STATE_MISMATCH"
    SIGN_IN_NOT_APPLICABLE = "SIGN_IN_NOT_APPLICABLE"
    OAUTH_URL_REFUSED = "OAUTH_URL_REFUSED"
    OAUTH_DISCOVERY_FAILED = "OAUTH_DISCOVERY_FAILED"
    OAUTH_REGISTRATION_FAILED = "OAUTH_REGISTRATION_FAILED"
    OAUTH_GRANT_REFUSED = "OAUTH_GRANT_REFUSED"
    CONNECTION_AUTHORIZATION_REQUIRED = "CONNECTION_AUTHORIZATION_REQUIRED"
    OAUTH_ISSUER_MISMATCH = "OAUTH_ISSUER_MISMATCH"
    SIGN_IN_ISSUER_MISMATCH = "SIGN_IN_ISSUER_MISMATCH"
    OAUTH_METADATA_REFUSED = "OAUTH_METADATA_REFUSED"
    TOOL_TASK_NOT_FOUND = "TOOL_TASK_NOT_FOUND"
    INPUT_NOT_AWAITED = "INPUT_NOT_AWAITED"


# Ids and names a caller sent are quoted in messages and metadata only up to this many
# characters: a megabyte id must not push the error past gRPC's metadata limit (the client
# would get a bare RESOURCE_EXHAUSTED without its ErrorInfo).
MAX_QUOTED_CHARS = 64


def short(value: object, limit: int = MAX_QUOTED_CHARS) -> str:
    """A caller's id or name, cut to a short prefix ("…" marks the cut)."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "…"


def quoted(value: object) -> str:
    """`short(value)`, in quotes."""
    return repr(short(value))


@dataclass_transform(kw_only_default=True, eq_default=False)
@dataclass(eq=False)
class SidecarError(Exception):
    """An error the caller can act on: one reason of the ErrorInfo catalogue (`reason`, set by
    each subclass), a message, and the typed fields that reason's metadata carries (the
    subclass's dataclass fields, named as docs/errors.md lists them; a test keeps the two
    identical). Raise a subclass; switch on the class or on `reason`.

    A subclass that declares fields is made a dataclass of them, keyword-only after the
    message, as it is declared (`__init_subclass__`); one that only sets `reason` keeps its
    parent's constructor."""

    reason: ClassVar[Reason]
    # Set on errors a caller may retry: how long to wait first (google.rpc.RetryInfo).
    retry_delay_seconds: ClassVar[float | None] = None

    message: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if inspect.get_annotations(cls):
            dataclass(eq=False, kw_only=True)(cls)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def metadata(self) -> dict[str, str]:
        """ErrorInfo's metadata: every field but the message, as strings (a field left None
        is left out)."""
        return {
            field.name: str(value)
            for field in fields(self)
            if field.name != "message" and (value := getattr(self, field.name)) is not None
        }


# Errors of a field in the request ------------------------------------------------------------


class FieldRequired(SidecarError):
    reason = Reason.FIELD_REQUIRED
    field: str


class FieldError(SidecarError):
    """A field's value refused, and why."""

    field: str
    detail: str


class FieldInvalid(FieldError):
    reason = Reason.FIELD_INVALID


class SpecThresholdsContradict(FieldError):
    reason = Reason.SPEC_THRESHOLDS_CONTRADICT


class PatternInvalid(FieldError):
    reason = Reason.PATTERN_INVALID


class PatternTooComplex(FieldError):
    reason = Reason.PATTERN_TOO_COMPLEX


# Specs, Runs and their logs ----------------------------------------------------------------------


class SpecVersionError(SidecarError):
    spec_name: str
    spec_version: int


class SpecNotFound(SpecVersionError):
    reason = Reason.SPEC_NOT_FOUND


class SpecVersionExists(SpecVersionError):
    reason = Reason.SPEC_VERSION_EXISTS


class RunNotFound(SidecarError):
    reason = Reason.RUN_NOT_FOUND
    run_id: str


class RequestIdReused(SidecarError):
    reason = Reason.REQUEST_ID_REUSED
    run_id: str
    request_id: str


class InvalidDeferredHandle(SidecarError):
    reason = Reason.INVALID_DEFERRED_HANDLE
    run_id: str
    handle: str


class MessageTooLarge(SidecarError):
    reason = Reason.MESSAGE_TOO_LARGE
    limit_bytes: int
    size_bytes: int


class ContextBudgetExceeded(SidecarError):
    reason = Reason.CONTEXT_BUDGET_EXCEEDED
    estimated_tokens: int
    full_estimated_tokens: int
    context_window_tokens: int
    output_reserve_tokens: int
    budget_tokens: int


# Connections and their catalogues --------------------------------------------------------------


class ConnectionNotFound(SidecarError):
    reason = Reason.CONNECTION_NOT_FOUND
    tenant: str
    connection: str


class CommandNotAllowed(SidecarError):
    reason = Reason.COMMAND_NOT_ALLOWED
    command: str
    # The environment variable refused, when that is the refusal.
    env: str | None = None


class CatalogVersionNotFound(SidecarError):
    reason = Reason.CATALOG_VERSION_NOT_FOUND
    connection: str
    catalog_version: int


class ConnectionFailure(SidecarError):
    """A connection's server (or its authorization server) failed or refused, and why."""

    connection: str
    detail: str


class ConnectionUnreachable(ConnectionFailure):
    """The server could not be reached just now (nothing was removed, no answer was spent):
    the same request may be sent again."""

    reason = Reason.CONNECTION_UNREACHABLE


class OAuthRegistrationFailed(ConnectionFailure):
    reason = Reason.OAUTH_REGISTRATION_FAILED


class OAuthGrantRefused(ConnectionFailure):
    reason = Reason.OAUTH_GRANT_REFUSED


class OAuthUrlError(SidecarError):
    """A URL of a sign-in's discovery or flow, refused or failed, and why."""

    connection: str
    url: str
    detail: str


class OAuthUrlRefused(OAuthUrlError):
    reason = Reason.OAUTH_URL_REFUSED


class OAuthDiscoveryFailed(OAuthUrlError):
    """The metadata could not be had (the network, the server's answer): retryable."""

    reason = Reason.OAUTH_DISCOVERY_FAILED


class OAuthMetadataRefused(OAuthUrlError):
    """The metadata was had and is refused for what it says: not retryable."""

    reason = Reason.OAUTH_METADATA_REFUSED


class OAuthIssuerMismatch(SidecarError):
    """A client's credentials are bound to one authorization server and the MCP server named
    another: nothing was sent to the other."""

    reason = Reason.OAUTH_ISSUER_MISMATCH
    connection: str
    bound_issuer: str
    named_issuer: str


class ConnectionAuthorizationRequired(SidecarError):
    reason = Reason.CONNECTION_AUTHORIZATION_REQUIRED
    connection: str
    # The contract's AuthorizationRequiredReason name without its prefix.
    reason_name: str

    @property
    def metadata(self) -> dict[str, str]:
        # The catalogue's key is `reason`, which the class attribute names already.
        return {"connection": self.connection, "reason": self.reason_name}


class SignInNotApplicable(SidecarError):
    reason = Reason.SIGN_IN_NOT_APPLICABLE
    connection: str
    auth: str


# Sign-in states --------------------------------------------------------------------------------


class SignInStateUnknown(SidecarError):
    reason = Reason.SIGN_IN_STATE_UNKNOWN
    tenant: str


class SignInStateWrongTenant(SignInStateUnknown):
    reason = Reason.SIGN_IN_STATE_WRONG_TENANT


class SignInStateUsed(SidecarError):
    reason = Reason.SIGN_IN_STATE_USED
    tenant: str
    connection: str


class SignInStateExpired(SidecarError):
    reason = Reason.SIGN_IN_STATE_EXPIRED
    tenant: str
    connection: str
    expire_time: str


class SignInStateMismatch(SidecarError):
    reason = Reason.SIGN_IN_STATE_MISMATCH
    tenant: str
    connection: str
    detail: str


class SignInIssuerMismatch(SidecarError):
    """The authorization response's `iss` (RFC 9207) is not the sign-in's authorization
    server, or is missing where that server said it sends one."""

    reason = Reason.SIGN_IN_ISSUER_MISMATCH
    tenant: str
    connection: str
    issuer: str
    iss: str


# The sidecar itself ----------------------------------------------------------------------------


class NotImplementedHere(SidecarError):
    reason = Reason.NOT_IMPLEMENTED
    method: str


class InternalError(SidecarError):
    reason = Reason.INTERNAL
    correlation_id: str


# How long a caller should wait before retrying after STORAGE_UNAVAILABLE.
STORAGE_RETRY_DELAY_SECONDS = 0.5


class StorageUnavailable(SidecarError):
    """The database could not be used just now (down, locked, a lost serialization race);
    nothing was stored, and the same request may be retried."""

    reason = Reason.STORAGE_UNAVAILABLE
    retry_delay_seconds = STORAGE_RETRY_DELAY_SECONDS
    detail: str


class ShuttingDown(SidecarError):
    reason = Reason.SHUTTING_DOWN
    grace_seconds: float


class InputNotAwaited(SidecarError):
    """ContinueToolCall names an attempt no call of the Run waits on."""

    reason = Reason.INPUT_NOT_AWAITED
    run_id: str
    call_id: str
    detail: str


def input_not_awaited(run_id: str, call_id: str, detail: str) -> InputNotAwaited:
    return InputNotAwaited(
        f"no call {quoted(call_id)} of run {short(run_id)} waits on that attempt: {detail}",
        run_id=short(run_id),
        call_id=short(call_id),
        detail=detail,
    )


# The errors most often raised, with their messages ----------------------------------------------


def field_required(field: str) -> FieldRequired:
    return FieldRequired(f"{field} is required", field=field)


def field_invalid(field: str, detail: str) -> FieldInvalid:
    return FieldInvalid(f"{field}: {detail}", field=field, detail=detail)


def spec_not_found(name: str, version: int) -> SpecNotFound:
    return SpecNotFound(
        f"no spec {short(name)} version {version}", spec_name=short(name), spec_version=version
    )


def run_not_found(run_id: str) -> RunNotFound:
    return RunNotFound(f"no run {short(run_id)}", run_id=short(run_id))


def storage_unavailable(detail: str) -> StorageUnavailable:
    return StorageUnavailable(f"storage unavailable: {detail}", detail=detail)


class ToolTaskNotFound(SidecarError):
    """GetToolTask or CancelToolTask named a call that is not a task."""

    reason = Reason.TOOL_TASK_NOT_FOUND
    run_id: str
    call_id: str


def tool_task_not_found(run_id: str, call_id: str) -> ToolTaskNotFound:
    return ToolTaskNotFound(
        f"the call {short(call_id)!r} of run {short(run_id)} did not start as a task",
        run_id=short(run_id),
        call_id=short(call_id),
    )

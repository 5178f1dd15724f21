"""Typed domain errors. Each carries one reason from the contract's ErrorReason catalogue."""

from __future__ import annotations

from enum import StrEnum


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


class SidecarError(Exception):
    """An error the caller can act on: a reason, a message, and metadata for ErrorInfo."""

    # Set on errors a caller may retry: how long to wait first (google.rpc.RetryInfo).
    retry_delay_seconds: float | None = None

    def __init__(self, reason: Reason, message: str, **metadata: object) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = {key: str(value) for key, value in metadata.items()}


def field_required(field: str) -> SidecarError:
    return SidecarError(Reason.FIELD_REQUIRED, f"{field} is required", field=field)


def field_invalid(field: str, detail: str) -> SidecarError:
    return SidecarError(Reason.FIELD_INVALID, f"{field}: {detail}", field=field, detail=detail)


def spec_not_found(name: str, version: int) -> SidecarError:
    return SidecarError(
        Reason.SPEC_NOT_FOUND,
        f"no spec {short(name)} version {version}",
        spec_name=short(name),
        spec_version=version,
    )


def run_not_found(run_id: str) -> SidecarError:
    return SidecarError(Reason.RUN_NOT_FOUND, f"no run {short(run_id)}", run_id=short(run_id))


# How long a caller should wait before retrying after STORAGE_UNAVAILABLE.
STORAGE_RETRY_DELAY_SECONDS = 0.5


def storage_unavailable(detail: str) -> SidecarError:
    """The database could not be used just now (down, locked, a lost serialization race);
    nothing was stored, and the same request may be retried."""
    error = SidecarError(
        Reason.STORAGE_UNAVAILABLE, f"storage unavailable: {detail}", detail=detail
    )
    error.retry_delay_seconds = STORAGE_RETRY_DELAY_SECONDS
    return error

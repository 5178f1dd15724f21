"""Domain errors to google.rpc.Status with exactly one ErrorInfo."""

from __future__ import annotations

from typing import NoReturn

import google.rpc.error_details_pb2 as error_details_pb2
import google.rpc.status_pb2 as status_pb2
import grpc
from google.protobuf import any_pb2, duration_pb2

from psych_sidecar.api.plumbing import Context
from psych_sidecar.domain.errors import Reason, SidecarError

ERROR_DOMAIN = "psych.sidecar.v1"
STATUS_DETAILS_KEY = "grpc-status-details-bin"

STATUS_CODES: dict[Reason, grpc.StatusCode] = {
    Reason.FIELD_REQUIRED: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.FIELD_INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.SPEC_THRESHOLDS_CONTRADICT: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.SPEC_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.SPEC_VERSION_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Reason.RUN_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.REQUEST_ID_REUSED: grpc.StatusCode.ALREADY_EXISTS,
    Reason.MESSAGE_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.CONTEXT_BUDGET_EXCEEDED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.INVALID_DEFERRED_HANDLE: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.CONNECTION_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.COMMAND_NOT_ALLOWED: grpc.StatusCode.PERMISSION_DENIED,
    Reason.CATALOG_VERSION_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.CONNECTION_UNREACHABLE: grpc.StatusCode.UNAVAILABLE,
    Reason.PATTERN_INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.PATTERN_TOO_COMPLEX: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.NOT_IMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    Reason.INTERNAL: grpc.StatusCode.INTERNAL,
    Reason.STORAGE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Reason.SHUTTING_DOWN: grpc.StatusCode.UNAVAILABLE,
    Reason.SIGN_IN_STATE_UNKNOWN: grpc.StatusCode.NOT_FOUND,
    Reason.SIGN_IN_STATE_USED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.SIGN_IN_STATE_EXPIRED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.SIGN_IN_STATE_WRONG_TENANT: grpc.StatusCode.PERMISSION_DENIED,
    Reason.SIGN_IN_STATE_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.SIGN_IN_NOT_APPLICABLE: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.OAUTH_URL_REFUSED: grpc.StatusCode.PERMISSION_DENIED,
    Reason.OAUTH_DISCOVERY_FAILED: grpc.StatusCode.UNAVAILABLE,
    Reason.OAUTH_REGISTRATION_FAILED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.OAUTH_GRANT_REFUSED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.CONNECTION_AUTHORIZATION_REQUIRED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.OAUTH_ISSUER_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.SIGN_IN_ISSUER_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.OAUTH_METADATA_REFUSED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.TOOL_TASK_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.INPUT_NOT_AWAITED: grpc.StatusCode.FAILED_PRECONDITION,
}


# Whatever a caller sent that ends up quoted in an error, the error stays far below gRPC's
# 8 KiB metadata limit (message and details travel as trailers): past it the client would get
# a bare RESOURCE_EXHAUSTED without its ErrorInfo. Domain errors already quote ids shortly
# (domain/errors.py `short`); this is the backstop for every other path.
# Bytes of UTF-8: the message travels percent-encoded (up to 3 characters a byte) and again
# inside the base64 details; together well under 8 KiB.
MAX_MESSAGE_BYTES = 640
MAX_METADATA_VALUE_BYTES = 256


def _cut(text: str, limit: int) -> str:
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    return encoded[: limit - 3].decode(errors="ignore") + "…"


def status_for(error: SidecarError) -> tuple[grpc.StatusCode, str, bytes]:
    """The status code, message and serialized google.rpc.Status for an error."""
    code = STATUS_CODES[error.reason]
    message = _cut(error.message, MAX_MESSAGE_BYTES)
    metadata = {key: _cut(value, MAX_METADATA_VALUE_BYTES) for key, value in error.metadata.items()}
    info = error_details_pb2.ErrorInfo(
        reason=error.reason.value, domain=ERROR_DOMAIN, metadata=metadata
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    details = [detail]
    if error.retry_delay_seconds is not None:
        # Retry advice beside the one ErrorInfo: how long to wait before trying again.
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(error.retry_delay_seconds * 1e9))
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(retry)
    status = status_pb2.Status(code=code.value[0], message=message, details=details)
    return code, message, status.SerializeToString()


async def abort(context: Context, error: SidecarError) -> NoReturn:
    code, message, details = status_for(error)
    await context.abort(code, message, trailing_metadata=((STATUS_DETAILS_KEY, details),))

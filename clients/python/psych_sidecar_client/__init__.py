"""A thin host client for psych-sidecar, beside the generated stubs (which stay the contract).

    with connect("unix:///run/psych/sidecar.sock") as sidecar:
        run = sidecar.call(sidecar.runs.CreateRun, CreateRunRequest(...)).run
        appended = sidecar.append_records(AppendRecordsRequest(run_id=run.run_id, ...))

It dials a Unix socket or TCP address and waits, bounded, for grpc.health.v1 to report
SERVING; gives every call a deadline; turns the sidecar's ErrorInfo into a SidecarError
whose `reason` is a generated ErrorReason value; and retries an AppendRecords on
UNAVAILABLE or DEADLINE_EXCEEDED with the same request id, so a lost response never
stores twice.
"""

from psych.sidecar.v1.errors_pb2 import ErrorReason
from psych_sidecar_client._client import (
    DEFAULT_APPEND_ATTEMPTS,
    DEFAULT_CALL_TIMEOUT_SECONDS,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_READY_TIMEOUT_SECONDS,
    RETRYABLE_CODES,
    SidecarClient,
    SidecarError,
    check_address,
    connect,
)

__all__ = [
    "DEFAULT_APPEND_ATTEMPTS",
    "DEFAULT_CALL_TIMEOUT_SECONDS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_READY_TIMEOUT_SECONDS",
    "RETRYABLE_CODES",
    "ErrorReason",
    "SidecarClient",
    "SidecarError",
    "check_address",
    "connect",
]

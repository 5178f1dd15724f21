"""A thin host client for psych-sidecar, beside the generated stubs (which stay the contract).

    with connect("unix:///run/psych/sidecar.sock") as sidecar:
        run = sidecar.call(sidecar.runs.CreateRun, CreateRunRequest(...)).run
        appended = sidecar.append_records(AppendRecordsRequest(run_id=run.run_id, ...))

It dials a Unix socket or TCP address and waits, bounded, for grpc.health.v1 to report
SERVING; gives every call a deadline; turns the sidecar's ErrorInfo into a SidecarError
whose `reason` is a generated ErrorReason value; and retries an AppendRecords on
UNAVAILABLE or DEADLINE_EXCEEDED with the same request id, so a lost response never
stores twice.

A reasoning model's response becomes the record to append with `anthropic_record`,
`openai_record` or `gemini_record` (its thinking, reasoning items and thought signatures
kept as provider blocks), and `request_body` picks the body to send that provider.
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
from psych_sidecar_client._provider_blocks import (
    anthropic_record,
    gemini_record,
    openai_record,
    request_body,
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
    "anthropic_record",
    "check_address",
    "connect",
    "gemini_record",
    "openai_record",
    "request_body",
]

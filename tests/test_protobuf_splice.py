"""A bytes field spliced into a serialized message at the wire level parses as the message
with that field set, whatever the lengths (varints of one to several bytes) and the fields
already set around it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from psych.sidecar.v1 import tool_service_pb2
from psych_sidecar.bulk.protobuf_splice import with_nested_bytes

OUTCOME = tool_service_pb2.DispatchToolCallResponse.DESCRIPTOR.fields_by_name["outcome"].number
RESULT_JSON = tool_service_pb2.ToolOutcome.DESCRIPTOR.fields_by_name["result_json"].number


@given(
    value=st.binary(max_size=300) | st.sampled_from([b"x" * 16_384, b"y" * 2_097_153]),
    sequence=st.integers(min_value=0, max_value=2**62),
    handle=st.text(max_size=20),
    is_error=st.booleans(),
)
def test_the_spliced_message_parses_as_the_one_with_the_field_set(
    value: bytes, sequence: int, handle: str, is_error: bool
) -> None:
    head = tool_service_pb2.DispatchToolCallResponse(
        disposition=tool_service_pb2.DISPATCH_DISPOSITION_EXECUTED
    )
    head.outcome.is_error = is_error
    head.outcome.sequence = sequence
    head.outcome.handle = handle
    expected = tool_service_pb2.DispatchToolCallResponse()
    expected.CopyFrom(head)
    expected.outcome.result_json = value

    spliced = with_nested_bytes(head.SerializeToString(), OUTCOME, RESULT_JSON, value)

    assert tool_service_pb2.DispatchToolCallResponse.FromString(spliced) == expected

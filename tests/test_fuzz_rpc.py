"""Property: whatever a host sends, no RPC answers INTERNAL or UNKNOWN, and every error carries
exactly one google.rpc.ErrorInfo.

Requests are built from the protobuf descriptors of every RPC in the contract (so a new RPC or
field is fuzzed without touching this file), with strings biased towards values that reach
deep into the sidecar (the real Run, spec, handle, connection and tool names, sidecar tool
names, JSON arguments) and the edge values that once reached INTERNAL: JSON nested 100,000
deep, timestamps out of range or with negative nanos, durations out of range, int64 extremes
that overflow usage totals. Derandomized, so every run sends the same requests; at least
5,000 per run across the RPCs. The sidecar runs against SQLite with a real MCP server
connected, so tool calls go all the way to MCP and back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import grpc
import pytest
from google.protobuf import descriptor, message_factory, struct_pb2, timestamp_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psych.sidecar.v1 import (
    connection_service_pb2,
    content_pb2,
    run_pb2,
    run_service_pb2,
    spec_service_pb2,
    tool_service_pb2,
    turn_service_pb2,
    usage_service_pb2,
)
from tests.support.connections import fixture_commands, put_stdio
from tests.support.polling import wait_for
from tests.support.requests import new_run, tool_result, user
from tests.support.sidecar import RunningSidecar, Stubs

SERVICES = [
    module.DESCRIPTOR.services_by_name[name]
    for module, name in [
        (spec_service_pb2, "SpecService"),
        (run_service_pb2, "RunService"),
        (connection_service_pb2, "ConnectionService"),
        (turn_service_pb2, "TurnService"),
        (tool_service_pb2, "ToolService"),
        (usage_service_pb2, "UsageService"),
    ]
]
METHODS = [method for service in SERVICES for method in service.methods]
TOTAL_REQUESTS = 5_000
EXAMPLES_PER_METHOD = math.ceil(TOTAL_REQUESTS / len(METHODS))
TENANT = "fuzz"
SPEC = "fuzz-spec"
CONNECTION = "fx"

DEEP_JSON = "[" * 100_000 + "]" * 100_000
EDGE_STRINGS = [
    "",
    "\x00",
    "x" * 5_000,
    DEEP_JSON,
    '{"a":' * 70 + "1" + "}" * 70,
    "{}",
    "[]",
    "null",
    '{"query": "echo"}',
    '{"server": "fx"}',
    '{"server": "fx", "tool": "echo", "arguments": {"text": "hi"}}',
    "*",
    "(",
    "a" * 100 + "(",
    "é\u202e\U0001f600",
]
INT64 = (-(2**63), 2**63 - 1)
EDGE_INTS = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 10**12]
TIMESTAMP_SECONDS = [0, -1, -62_135_596_800, -62_135_596_801, 253_402_300_799, 253_402_300_800]
TIMESTAMP_SECONDS += [2**63 - 1, -(2**63), 1_700_000_000]
NANOS = [0, -1, 999_999_999, 1_000_000_000, -(2**31), 2**31 - 1]


class Known:
    """Values of the fuzzing world, filled once the sidecar is set up."""

    strings: ClassVar[dict[str, list[str]]] = {}
    generic: ClassVar[list[str]] = []
    sent: ClassVar[dict[str, int]] = {}


# SQLite only: the fuzzer is about request handling, which both backends share.
SIDECAR_DATABASES = ["sqlite"]
# Loopback TCP: the transport is not what is fuzzed.
SIDECAR_TRANSPORTS = ["tcp"]


# The fixture MCP server may be connected; tool calls give up after 3 s.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": fixture_commands(),
    "tool_call_timeout_seconds": 3.0,
}


@pytest.fixture(scope="module")
def world(grpc_server: RunningSidecar, stubs: Stubs) -> Iterator[grpc.Channel]:
    """A spec, a Run with a call and its result (a handle), a connected MCP server."""
    put_stdio(stubs, TENANT, CONNECTION, command="fixture-fixed")
    wait_for(
        lambda: (
            stubs.connections.ListConnections(
                connection_service_pb2.ListConnectionsRequest(tenant=TENANT)
            )
            .connections[0]
            .catalog_version
            > 0
        ),
        "the fixture server's first listing",
    )
    run_id = new_run(stubs, SPEC, tenant=TENANT)
    call = content_pb2.ToolCall(call_id="c1", name="fx__echo", arguments_json='{"text":"hi"}')
    appended = stubs.runs.AppendRecords(
        run_service_pb2.AppendRecordsRequest(
            run_id=run_id,
            records=[
                user("hello"),
                run_pb2.Record(assistant_message=run_pb2.AssistantMessage(tool_calls=[call])),
                tool_result("c1", content_pb2.ContentPart(text="line one\nline two")),
            ],
        )
    )
    handle = appended.records[-1].handle
    tools = ["echo", "pid", "structured", "tool_error", "fail", "image", "nope"]
    sidecar_tools = ["mcp_list_tools", "mcp_describe_tool", "mcp_call_tool", "mcp_search_tools"]
    Known.strings = {
        "run_id": [run_id],
        "tenant": [TENANT],
        "spec_name": [SPEC],
        "name": [SPEC, CONNECTION, *sidecar_tools, "fx__echo", "read_tool_output"],
        "handle": [handle],
        "server": [CONNECTION, "sidecar"],
        "connection": [CONNECTION],
        "tool": tools,
        "call_id": ["c1", "c2"],
        "request_id": ["r1", "r2"],
        "arguments_json": [
            "{}",
            '{"text": "hi"}',
            '{"server": "fx"}',
            '{"server": "fx", "tool": "echo"}',
            f'{{"handle": "{handle}"}}',
            '{"query": "echo"}',
        ],
        "command": ["fixture", "fixture-fixed", "rm"],
        "model": ["claude", "gpt"],
    }
    Known.generic = [run_id, SPEC, TENANT, handle, CONNECTION, "echo", *EDGE_STRINGS]
    channel = grpc.insecure_channel(
        grpc_server.sidecar.bound[0],
        options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
    )
    yield channel
    channel.close()


# Requests, from the descriptors


def _json_values() -> st.SearchStrategy[Any]:
    leaves = st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=20)
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=8,
    )


def _string(field: descriptor.FieldDescriptor) -> st.SearchStrategy[str]:
    known = Known.strings.get(field.name, [])
    choices = [st.sampled_from(Known.generic), st.text(max_size=40)]
    if known:
        choices = [st.sampled_from(known), st.sampled_from(known), *choices]
    return st.one_of(*choices)


def _scalar(field: descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    types = descriptor.FieldDescriptor
    kind = field.type
    if kind == types.TYPE_STRING:
        return _string(field)
    if kind == types.TYPE_BYTES:
        return st.one_of(
            _string(field).map(lambda value: value.encode()),
            st.binary(max_size=40),
            st.just(b"\xff\xfe"),
        )
    if kind == types.TYPE_BOOL:
        return st.booleans()
    if kind == types.TYPE_ENUM:
        assert field.enum_type is not None
        numbers = [value.number for value in field.enum_type.values]
        return st.one_of(st.sampled_from(numbers), st.integers(-5, 50))
    if kind in (types.TYPE_DOUBLE, types.TYPE_FLOAT):
        return st.floats(allow_nan=True, width=32 if kind == types.TYPE_FLOAT else 64)
    bounds = {
        types.TYPE_INT32: (-(2**31), 2**31 - 1),
        types.TYPE_SINT32: (-(2**31), 2**31 - 1),
        types.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
        types.TYPE_UINT32: (0, 2**32 - 1),
        types.TYPE_FIXED32: (0, 2**32 - 1),
        types.TYPE_UINT64: (0, 2**64 - 1),
        types.TYPE_FIXED64: (0, 2**64 - 1),
    }
    low, high = bounds.get(kind, INT64)
    edges = [value for value in EDGE_INTS if low <= value <= high]
    return st.one_of(st.sampled_from(edges), st.integers(-3, 300), st.integers(low, high))


def _message(message_type: descriptor.Descriptor, depth: int) -> st.SearchStrategy[Message]:
    # A generated class takes its fields as keywords, which Message's stub does not declare.
    message_class: Callable[..., Message] = message_factory.GetMessageClass(message_type)
    full_name = message_type.full_name
    if full_name == "google.protobuf.Timestamp" or full_name == "google.protobuf.Duration":
        seconds = TIMESTAMP_SECONDS + ([3, 0, -5, 315_576_000_001] if "Dur" in full_name else [])
        return st.builds(
            lambda s, n: message_class(seconds=s, nanos=n),
            st.one_of(st.sampled_from(seconds), st.integers(0, 2_000_000_000)),
            st.one_of(st.sampled_from(NANOS), st.integers(0, 999_999_999)),
        )
    if full_name == "google.protobuf.Struct":

        def struct(value: dict[str, Any]) -> Message:
            built = struct_pb2.Struct()
            built.update(value)
            return built

        return st.dictionaries(st.sampled_from(["text", "name", "x"]), _json_values()).map(struct)
    fields = {}
    for field in message_type.fields:
        strategy = _field(field, depth)
        if strategy is not None:
            fields[field.name] = strategy

    def build(values: dict[str, Any]) -> Message:
        built = message_class()
        for name, value in values.items():
            field = message_type.fields_by_name[name]
            _assign(built, field, value)
        return built

    return st.fixed_dictionaries({}, optional=fields).map(build)


def _field(field: descriptor.FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key = _scalar(field.message_type.fields_by_name["key"])
        value_field = field.message_type.fields_by_name["value"]
        if value_field.message_type is not None:
            if depth >= 3:
                return None
            value = _message(value_field.message_type, depth + 1)
        else:
            value = _scalar(value_field)
        return st.dictionaries(key, value, max_size=3)
    if field.message_type is not None:
        if depth >= 4:
            return None
        single = _message(field.message_type, depth + 1)
    else:
        single = _scalar(field)
    if field.is_repeated:
        return st.lists(single, max_size=3)
    return single


def _assign(message: Message, field: descriptor.FieldDescriptor, value: Any) -> None:
    target = getattr(message, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_is_message = field.message_type.fields_by_name["value"].message_type is not None
        for key, item in value.items():
            if value_is_message:
                target[key].CopyFrom(item)
            else:
                target[key] = item
        return
    if field.is_repeated:
        if field.message_type is not None:
            for item in value:
                target.add().CopyFrom(item)
        else:
            target.extend(value)
        return
    if field.message_type is not None:
        target.CopyFrom(value)
        return
    setattr(message, field.name, value)


# The property


def _check(channel: grpc.Channel, method: descriptor.MethodDescriptor, request: Message) -> None:
    response_class = message_factory.GetMessageClass(method.output_type)
    call: grpc.UnaryUnaryMultiCallable[Message, Message] = channel.unary_unary(
        f"/{method.containing_service.full_name}/{method.name}",
        request_serializer=lambda message: message.SerializeToString(),
        response_deserializer=response_class.FromString,
    )
    Known.sent[method.name] = Known.sent.get(method.name, 0) + 1
    try:
        call(request, timeout=30)
    except grpc.RpcError as error:
        failed: Any = error
        code = failed.code()
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
            f"{method.name} answered {code.name}: {failed.details()}\nrequest: {request}"[:3000]
        )
        status = rpc_status.from_call(failed)
        assert status is not None, f"{method.name}: {code.name} without a google.rpc.Status"
        infos = [
            detail for detail in status.details if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)
        ]
        assert len(infos) == 1, f"{method.name}: {len(infos)} ErrorInfo in {status}"


@pytest.mark.parametrize("method", METHODS, ids=[method.name for method in METHODS])
def test_no_request_reaches_internal(
    world: grpc.Channel, method: descriptor.MethodDescriptor
) -> None:
    @settings(
        max_examples=EXAMPLES_PER_METHOD,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=_message(method.input_type, 0))
    def property_(request: Message) -> None:
        _check(world, method, request)

    property_()


# The inputs that once reached INTERNAL, each sent once explicitly.


def _timestamp(seconds: int, nanos: int = 0) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


def test_known_edge_inputs_are_typed_answers(world: grpc.Channel) -> None:
    run_id = Known.strings["run_id"][0]
    by_name = {method.name: method for method in METHODS}
    deep_call = content_pb2.ToolCall(call_id="c9", name="mcp_call_tool", arguments_json=DEEP_JSON)
    deep_part = content_pb2.ContentPart(json=DEEP_JSON.encode())
    probes: list[tuple[str, Message]] = [
        (
            "AppendRecords",
            run_service_pb2.AppendRecordsRequest(
                run_id=run_id,
                records=[run_pb2.Record(user_message=run_pb2.UserMessage(content=[deep_part]))],
            ),
        ),
        (
            "DispatchToolCall",
            tool_service_pb2.DispatchToolCallRequest(run_id=run_id, call=deep_call),
        ),
        (
            "AssemblePrompt",
            turn_service_pb2.AssemblePromptRequest(run_id=run_id, now=_timestamp(2**40)),
        ),
        (
            "AssemblePrompt",
            turn_service_pb2.AssemblePromptRequest(run_id=run_id, now=_timestamp(10, -1)),
        ),
    ]
    for request_id in ("big-1", "big-2"):
        probes.append(
            (
                "RecordUsage",
                usage_service_pb2.RecordUsageRequest(
                    run_id=run_id, request_id=request_id, model="m", input_tokens=2**63 - 1
                ),
            )
        )
    for name, request in probes:
        _check(world, by_name[name], request)
    # The Run can still report usage after an overflow was refused.
    _check(
        world,
        by_name["GetRunUsage"],
        usage_service_pb2.GetRunUsageRequest(run_id=run_id),
    )


def test_every_rpc_was_fuzzed_and_5000_requests_were_sent(world: grpc.Channel) -> None:
    """Runs last (pytest keeps file order): Hypothesis may stop early on a small input space,
    which would quietly shrink the run."""
    if len(Known.sent) < len(METHODS):
        pytest.skip("only part of the module ran")
    assert sum(Known.sent.values()) >= TOTAL_REQUESTS, Known.sent

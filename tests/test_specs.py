"""PublishSpec / GetSpec over the real server, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import grpc

from psych.sidecar.v1 import spec_pb2, spec_service_pb2
from tests.support.requests import publish
from tests.support.sidecar import Stubs, rpc_failure


def _get(stubs: Stubs, name: str, version: int) -> spec_pb2.Spec:
    return stubs.specs.GetSpec(spec_service_pb2.GetSpecRequest(name=name, version=version)).spec


def test_publish_then_get_round_trips_every_field(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    name = unique("agent")
    sent = spec_pb2.Spec(
        name=name,
        version=3,
        instructions="Be brief.\nNever guess.",
        skills=[spec_pb2.Skill(name="pdf", description="Read PDFs", body="Long body ✓")],
        subagents=[spec_pb2.Subagent(name="researcher", description="Finds sources")],
        capability_notes=["You can read files.", "You cannot browse."],
        thresholds=spec_pb2.Thresholds(per_result_tokens=1000, per_batch_tokens=1000),
        disclosure=spec_pb2.DisclosureSettings(direct_max_tools=5),
        grants=[spec_pb2.ToolGrant(server_pattern="git*", tool_pattern="*")],
    )
    published = stubs.specs.PublishSpec(spec_service_pb2.PublishSpecRequest(spec=sent)).spec
    assert published.create_time.seconds > 0
    fetched = _get(stubs, name, 3)
    assert fetched == published
    fetched.ClearField("create_time")
    assert fetched == sent
    assert not fetched.thresholds.HasField("preview_head_chars")


def test_republishing_identical_content_is_idempotent(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    name = unique("agent")
    first = publish(stubs, name, instructions="same")
    again = publish(stubs, name, instructions="same")
    assert again == first


def test_a_published_version_is_immutable(stubs: Stubs, unique: Callable[[str], str]) -> None:
    name = unique("agent")
    publish(stubs, name, instructions="original")
    failure = rpc_failure(lambda: publish(stubs, name, instructions="changed"))
    assert failure.code == grpc.StatusCode.ALREADY_EXISTS
    assert failure.info.reason == "SPEC_VERSION_EXISTS"
    assert failure.info.metadata["spec_version"] == "1"
    assert _get(stubs, name, 1).instructions == "original"


def test_contradicting_thresholds_are_refused_at_publish(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    name = unique("agent")
    thresholds = spec_pb2.Thresholds(per_result_tokens=9000, per_batch_tokens=8000)
    failure = rpc_failure(lambda: publish(stubs, name, thresholds=thresholds))
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT
    assert failure.info.reason == "SPEC_THRESHOLDS_CONTRADICT"
    assert failure.info.metadata["field"] == "spec.thresholds.per_result_tokens"
    assert rpc_failure(lambda: _get(stubs, name, 1)).info.reason == "SPEC_NOT_FOUND"


def test_thresholds_contradicting_a_default_are_refused(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    thresholds = spec_pb2.Thresholds(per_result_tokens=20000)  # default per-batch is 16000
    failure = rpc_failure(lambda: publish(stubs, unique("agent"), thresholds=thresholds))
    assert failure.info.reason == "SPEC_THRESHOLDS_CONTRADICT"


def test_missing_and_invalid_fields_name_the_field(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    cases = [
        (spec_pb2.Spec(version=1), "FIELD_REQUIRED", "spec.name"),
        (spec_pb2.Spec(name=unique("a")), "FIELD_REQUIRED", "spec.version"),
        (spec_pb2.Spec(name="has space", version=1), "FIELD_INVALID", "spec.name"),
        (spec_pb2.Spec(name=unique("a"), version=-2), "FIELD_INVALID", "spec.version"),
        (
            spec_pb2.Spec(
                name=unique("a"),
                version=1,
                skills=[spec_pb2.Skill(name="x"), spec_pb2.Skill(name="x")],
            ),
            "FIELD_INVALID",
            "spec.skills[1].name",
        ),
        (
            spec_pb2.Spec(
                name=unique("a"), version=1, thresholds=spec_pb2.Thresholds(per_batch_tokens=0)
            ),
            "FIELD_INVALID",
            "spec.thresholds.per_batch_tokens",
        ),
        (
            spec_pb2.Spec(
                name=unique("a"), version=1, grants=[spec_pb2.ToolGrant(server_pattern="x")]
            ),
            "FIELD_REQUIRED",
            "spec.grants[0].tool_pattern",
        ),
    ]
    for spec, reason, field in cases:
        failure = rpc_failure(
            partial(stubs.specs.PublishSpec, spec_service_pb2.PublishSpecRequest(spec=spec))
        )
        assert failure.code == grpc.StatusCode.INVALID_ARGUMENT, field
        assert (failure.info.reason, failure.info.metadata["field"]) == (reason, field)
    missing = rpc_failure(lambda: stubs.specs.PublishSpec(spec_service_pb2.PublishSpecRequest()))
    assert missing.info.metadata["field"] == "spec"


def test_unknown_spec_is_not_found(stubs: Stubs, unique: Callable[[str], str]) -> None:
    failure = rpc_failure(lambda: _get(stubs, unique("nobody"), 7))
    assert failure.code == grpc.StatusCode.NOT_FOUND
    assert failure.info.reason == "SPEC_NOT_FOUND"
    assert failure.info.metadata["spec_version"] == "7"

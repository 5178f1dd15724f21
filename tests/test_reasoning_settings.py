"""Each provider's thinking parameters, from the Spec or per call, over the real server on both
databases: the bodies carry them (validated with the official SDKs' types), and every
combination a provider would refuse is a typed error at publish or at the call."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc

from psych.sidecar.v1 import spec_pb2, spec_service_pb2
from psych_sidecar.domain.runlog import ReasoningSettings, Spec
from tests.support.prompts import (
    append,
    assemble,
    run_with,
    valid_anthropic,
    valid_gemini,
    valid_openai,
    valid_openai_responses,
)
from tests.support.requests import publish, user
from tests.support.sidecar import Stubs, rpc_failure

THINKING = spec_pb2.ReasoningSettings(
    anthropic_thinking=spec_pb2.ANTHROPIC_THINKING_ENABLED,
    anthropic_budget_tokens=2048,
    openai_reasoning_effort=spec_pb2.REASONING_EFFORT_HIGH,
    gemini_thinking_level=spec_pb2.GEMINI_THINKING_LEVEL_HIGH,
    gemini_include_thoughts=True,
)


def test_the_specs_settings_reach_each_body(stubs: Stubs, unique: Callable[[str], str]) -> None:
    name = unique("agent")
    run_id = run_with(stubs, name, reasoning=THINKING)
    append(stubs, run_id, user("Think hard."))
    response = assemble(stubs, run_id, max_tokens=4096)
    anthropic = valid_anthropic(response.anthropic_request_json)
    assert list(anthropic)[:3] == ["model", "max_tokens", "thinking"]
    assert anthropic["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert valid_openai(response.openai_request_json)["reasoning_effort"] == "high"
    responses = valid_openai_responses(response.openai_responses_request_json)
    assert responses["reasoning"] == {"effort": "high"}
    assert responses["include"] == ["reasoning.encrypted_content"]
    gemini = valid_gemini(response.gemini_request_json)
    assert gemini["generationConfig"] == {
        "maxOutputTokens": 4096,
        "thinkingConfig": {"thinkingLevel": "HIGH", "includeThoughts": True},
    }
    got = stubs.specs.GetSpec(spec_service_pb2.GetSpecRequest(name=name, version=1)).spec
    assert got.reasoning == THINKING


def test_a_call_overrides_the_spec_field_by_field(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), reasoning=THINKING)
    append(stubs, run_id, user("Think."))
    override = spec_pb2.ReasoningSettings(
        anthropic_thinking=spec_pb2.ANTHROPIC_THINKING_ADAPTIVE,
        openai_reasoning_effort=spec_pb2.REASONING_EFFORT_NONE,
        gemini_thinking_budget=-1,
    )
    response = assemble(stubs, run_id, reasoning=override)
    # Adaptive drops the Spec's budget; a Gemini budget drops the Spec's level.
    assert valid_anthropic(response.anthropic_request_json)["thinking"] == {"type": "adaptive"}
    responses = valid_openai_responses(response.openai_responses_request_json)
    assert responses["reasoning"] == {"effort": "none"}
    assert "include" not in responses
    gemini = valid_gemini(response.gemini_request_json)
    assert gemini["generationConfig"]["thinkingConfig"] == {
        "thinkingBudget": -1,
        "includeThoughts": True,
    }
    # Without settings, no body carries any.
    plain = run_with(stubs, unique("agent"))
    append(stubs, plain, user("Hi."))
    bodies = assemble(stubs, plain)
    assert "thinking" not in json.loads(bodies.anthropic_request_json)
    assert "reasoning_effort" not in json.loads(bodies.openai_request_json)
    assert "reasoning" not in json.loads(bodies.openai_responses_request_json)
    assert "thinkingConfig" not in json.loads(bodies.gemini_request_json)["generationConfig"]


def test_combinations_a_provider_refuses_are_refused_at_publish(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    def refused(settings: spec_pb2.ReasoningSettings) -> tuple[str, str]:
        failure = rpc_failure(lambda: publish(stubs, unique("agent"), reasoning=settings))
        assert failure.code is grpc.StatusCode.INVALID_ARGUMENT
        return failure.info.reason, failure.info.metadata["field"]

    enabled = spec_pb2.ANTHROPIC_THINKING_ENABLED
    assert refused(spec_pb2.ReasoningSettings(anthropic_thinking=enabled)) == (
        "FIELD_REQUIRED",
        "spec.reasoning.anthropic_budget_tokens",
    )
    small = spec_pb2.ReasoningSettings(anthropic_thinking=enabled, anthropic_budget_tokens=1000)
    assert refused(small) == ("FIELD_INVALID", "spec.reasoning.anthropic_budget_tokens")
    alone = spec_pb2.ReasoningSettings(anthropic_budget_tokens=4096)
    assert refused(alone) == ("FIELD_INVALID", "spec.reasoning.anthropic_budget_tokens")
    both = spec_pb2.ReasoningSettings(
        gemini_thinking_budget=1024, gemini_thinking_level=spec_pb2.GEMINI_THINKING_LEVEL_LOW
    )
    assert refused(both) == ("FIELD_INVALID", "spec.reasoning.gemini_thinking_level")
    for budget in (-2, 32769):
        settings = spec_pb2.ReasoningSettings(gemini_thinking_budget=budget)
        assert refused(settings) == ("FIELD_INVALID", "spec.reasoning.gemini_thinking_budget")
    unknown = spec_pb2.ReasoningSettings(openai_reasoning_effort=99)  # type: ignore[arg-type]
    assert refused(unknown) == ("FIELD_INVALID", "spec.reasoning.openai_reasoning_effort")


def test_combinations_a_provider_refuses_are_refused_at_the_call(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), reasoning=THINKING)
    append(stubs, run_id, user("Think."))

    def refused(**fields: object) -> tuple[str, str]:
        failure = rpc_failure(lambda: assemble(stubs, run_id, **fields))
        assert failure.code is grpc.StatusCode.INVALID_ARGUMENT
        return failure.info.reason, failure.info.metadata["field"]

    # The Spec's budget of 2048 is not below max_tokens 2048.
    assert refused(max_tokens=2048) == ("FIELD_INVALID", "max_tokens")
    both = spec_pb2.ReasoningSettings(
        gemini_thinking_budget=0, gemini_thinking_level=spec_pb2.GEMINI_THINKING_LEVEL_LOW
    )
    assert refused(reasoning=both) == ("FIELD_INVALID", "reasoning.gemini_thinking_level")
    disabled_with_budget = spec_pb2.ReasoningSettings(
        anthropic_thinking=spec_pb2.ANTHROPIC_THINKING_DISABLED, anthropic_budget_tokens=4096
    )
    assert refused(reasoning=disabled_with_budget) == (
        "FIELD_INVALID",
        "reasoning.anthropic_budget_tokens",
    )


def test_a_spec_without_settings_keeps_its_stored_bytes() -> None:
    spec = Spec(name="agent", version=1)
    assert "reasoning" not in json.loads(spec.content_json())
    thinking = Spec(name="agent", version=1, reasoning=ReasoningSettings(gemini_thinking_budget=0))
    assert Spec.from_content_json(thinking.content_json()) == thinking

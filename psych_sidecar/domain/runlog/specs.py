"""Specs: immutable, versioned agent configurations, validated once at publish."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, astuple, dataclass, field
from datetime import datetime
from typing import Any, Protocol

from psych_sidecar.domain.canonical import canonical_json, sorted_keys
from psych_sidecar.domain.errors import (
    SpecThresholdsContradict,
    field_invalid,
    field_required,
)
from psych_sidecar.domain.runlog.compaction_policy import (
    CompactionPolicy,
    require_trigger,
    validate_compaction,
)
from psych_sidecar.domain.runlog.programmatic import (
    ProgrammaticCalling,
    validate_programmatic_calling,
)
from psych_sidecar.domain.runlog.reasoning import ReasoningSettings, validate_reasoning

NAME_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


@dataclass(frozen=True, slots=True)
class Skill:
    name: str
    description: str = ""
    body: str = ""


@dataclass(frozen=True, slots=True)
class Subagent:
    name: str
    description: str = ""


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Large-result thresholds as the author set them; None takes the default."""

    per_result_tokens: int | None = None
    per_batch_tokens: int | None = None
    preview_head_chars: int | None = None
    preview_tail_chars: int | None = None
    failure_truncation_chars: int | None = None


@dataclass(frozen=True, slots=True)
class EffectiveThresholds:
    """Thresholds with every default applied."""

    per_result_tokens: int = 4000
    per_batch_tokens: int = 16000
    preview_head_chars: int = 1000
    preview_tail_chars: int = 500
    failure_truncation_chars: int = 400


@dataclass(frozen=True, slots=True)
class DisclosureSettings:
    """Catalogue-size thresholds for disclosure tiers; None takes the default."""

    auto_preload_max_tools: int | None = None
    direct_max_tools: int | None = None
    facade_max_tools: int | None = None
    # Whether a model's tool call may pass stored results by reference
    # (domain/calls/references.py), and is told so; None: yes.
    result_references: bool | None = None


@dataclass(frozen=True, slots=True)
class ContextBudget:
    """The model's context window and the output reserve, in estimated tokens; None takes
    the default (window 200,000; reserve: the request's max_tokens). The optional cap on a
    current-turn result's estimate is unset by default (no cap, as the spec says)."""

    context_window_tokens: int | None = None
    output_reserve_tokens: int | None = None
    current_turn_result_tokens: int | None = None

    def over(self, override: ContextBudget) -> ContextBudget:
        """This budget with the fields `override` sets replaced."""
        return ContextBudget(
            *(
                theirs if theirs is not None else mine
                for mine, theirs in zip(astuple(self), astuple(override), strict=True)
            )
        )

    def content(self) -> dict[str, int | None]:
        """The fields for the Spec's stored JSON: the cap only when set, so Specs stored
        before it existed keep their bytes and fingerprints."""
        content = asdict(self)
        if self.current_turn_result_tokens is None:
            del content["current_turn_result_tokens"]
        return content


DEFAULT_CONTEXT_WINDOW_TOKENS = 200_000


def validate_context_budget(budget: ContextBudget, field_path: str) -> None:
    window, reserve = budget.context_window_tokens, budget.output_reserve_tokens
    if window is not None and window <= 0:
        raise field_invalid(f"{field_path}.context_window_tokens", "must be greater than 0")
    if reserve is not None and reserve < 0:
        raise field_invalid(f"{field_path}.output_reserve_tokens", "must not be negative")
    cap = budget.current_turn_result_tokens
    if cap is not None and cap <= 0:
        raise field_invalid(f"{field_path}.current_turn_result_tokens", "must be greater than 0")
    if window is not None and reserve is not None and reserve >= window:
        raise field_invalid(
            f"{field_path}.output_reserve_tokens", "must be less than context_window_tokens"
        )


class _OptionalSettings(Protocol):
    """Settings a Spec stores only when set, as their `content()`."""

    def content(self) -> Mapping[str, object]: ...


@dataclass(frozen=True, slots=True)
class ToolGrant:
    server_pattern: str
    tool_pattern: str


@dataclass(frozen=True, slots=True)
class Spec:
    name: str
    version: int
    instructions: str = ""
    skills: tuple[Skill, ...] = ()
    subagents: tuple[Subagent, ...] = ()
    capability_notes: tuple[str, ...] = ()
    thresholds: Thresholds = field(default_factory=Thresholds)
    disclosure: DisclosureSettings = field(default_factory=DisclosureSettings)
    grants: tuple[ToolGrant, ...] = ()
    context_budget: ContextBudget = field(default_factory=ContextBudget)
    reasoning: ReasoningSettings = field(default_factory=ReasoningSettings)
    programmatic_calling: ProgrammaticCalling = field(default_factory=ProgrammaticCalling)
    # When AssemblePrompt proposes compacting the history (off unless a trigger is set).
    compaction: CompactionPolicy = field(default_factory=CompactionPolicy)

    def effective_thresholds(self) -> EffectiveThresholds:
        set_values = {k: v for k, v in asdict(self.thresholds).items() if v is not None}
        return EffectiveThresholds(**set_values)

    def content_json(self) -> str:
        """The Spec's content as canonical JSON (sorted keys): what is stored and compared for
        immutability. An unset context budget, reasoning, programmatic calling or compaction is
        left out, so Specs stored before they existed keep their bytes and fingerprints."""
        content = asdict(self)
        if self.disclosure.result_references is None:
            # Unset, it is left out, so Specs stored before it existed keep their bytes.
            del content["disclosure"]["result_references"]
        optional: tuple[tuple[str, _OptionalSettings, _OptionalSettings], ...] = (
            ("context_budget", self.context_budget, ContextBudget()),
            ("reasoning", self.reasoning, ReasoningSettings()),
            ("programmatic_calling", self.programmatic_calling, ProgrammaticCalling()),
            ("compaction", self.compaction, CompactionPolicy()),
        )
        for key, settings, unset in optional:
            if settings == unset:
                del content[key]
            else:
                content[key] = settings.content()
        return canonical_json(sorted_keys(content)).decode()

    def fingerprint(self) -> str:
        return hashlib.sha256(self.content_json().encode()).hexdigest()

    @classmethod
    def from_content_json(cls, text: str) -> Spec:
        data: dict[str, Any] = json.loads(text)
        return cls(
            name=data["name"],
            version=data["version"],
            instructions=data["instructions"],
            skills=tuple(Skill(**s) for s in data["skills"]),
            subagents=tuple(Subagent(**s) for s in data["subagents"]),
            capability_notes=tuple(data["capability_notes"]),
            thresholds=Thresholds(**data["thresholds"]),
            disclosure=DisclosureSettings(**data["disclosure"]),
            grants=tuple(ToolGrant(**g) for g in data["grants"]),
            context_budget=ContextBudget(**data.get("context_budget", {})),
            reasoning=ReasoningSettings.from_content(data.get("reasoning", {})),
            programmatic_calling=ProgrammaticCalling.from_content(
                data.get("programmatic_calling", {})
            ),
            compaction=CompactionPolicy.from_content(data.get("compaction", {})),
        )


@dataclass(frozen=True, slots=True)
class PublishedSpec:
    spec: Spec
    create_time: datetime


# Grant globs are matched against every tool of every turn: bounded in length and number
# (the matcher is linear, domain/catalog/narrowing.py; these keep its constant small).
MAX_GRANT_PATTERN_LENGTH = 256
MAX_GRANTS = 1024


def validate_name(value: str, field_path: str) -> None:
    if not value:
        raise field_required(field_path)
    if not NAME_PATTERN.fullmatch(value):
        raise field_invalid(field_path, "must be 1-128 characters of [A-Za-z0-9._-]")


def validate_version(value: int, field_path: str) -> None:
    if value == 0:
        raise field_required(field_path)
    if value < 0:
        raise field_invalid(field_path, "must be 1 or greater")


def validate_grants(grants: tuple[ToolGrant, ...], field_path: str) -> None:
    if len(grants) > MAX_GRANTS:
        raise field_invalid(field_path, f"at most {MAX_GRANTS} grants")
    for index, grant in enumerate(grants):
        for name in ("server_pattern", "tool_pattern"):
            value = getattr(grant, name)
            if not value:
                raise field_required(f"{field_path}[{index}].{name}")
            if len(value) > MAX_GRANT_PATTERN_LENGTH or "\x00" in value:
                raise field_invalid(
                    f"{field_path}[{index}].{name}",
                    f"must be at most {MAX_GRANT_PATTERN_LENGTH} characters, without NUL",
                )


def _validate_unique_names(names: list[str], field_path: str) -> None:
    seen: set[str] = set()
    for index, name in enumerate(names):
        if not name:
            raise field_required(f"{field_path}[{index}].name")
        if name in seen:
            raise field_invalid(f"{field_path}[{index}].name", f"duplicate name {name!r}")
        seen.add(name)


def validate_spec(spec: Spec) -> None:
    """Refuse a Spec that could only fail later, during a Run."""
    validate_name(spec.name, "spec.name")
    validate_version(spec.version, "spec.version")
    _validate_unique_names([s.name for s in spec.skills], "spec.skills")
    _validate_unique_names([s.name for s in spec.subagents], "spec.subagents")
    validate_grants(spec.grants, "spec.grants")
    for key, value in asdict(spec.thresholds).items():
        if value is not None and value <= 0 and not key.startswith("preview_"):
            raise field_invalid(f"spec.thresholds.{key}", "must be greater than 0")
        if value is not None and value < 0:
            raise field_invalid(f"spec.thresholds.{key}", "must not be negative")
    validate_context_budget(spec.context_budget, "spec.context_budget")
    validate_reasoning(spec.reasoning, "spec.reasoning")
    validate_programmatic_calling(spec.programmatic_calling, "spec.programmatic_calling")
    validate_compaction(spec.compaction, "spec.compaction")
    require_trigger(spec.compaction, "spec.compaction")
    for key, value in asdict(spec.disclosure).items():
        if value is not None and value < 0:
            raise field_invalid(f"spec.disclosure.{key}", "must not be negative")
    effective = spec.effective_thresholds()
    if effective.per_result_tokens > effective.per_batch_tokens:
        detail = (
            f"per_result_tokens {effective.per_result_tokens} exceeds "
            f"per_batch_tokens {effective.per_batch_tokens}"
        )
        raise SpecThresholdsContradict(
            detail,
            field="spec.thresholds.per_result_tokens",
            detail=detail,
        )

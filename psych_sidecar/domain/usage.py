"""Metering: provider-reported token usage per model call, and a Run's totals.

Cost is computed from these numbers only. This module, its storage and its servicer must
never reach the token estimator (an import-linter contract in pyproject.toml fails the
build if they do, directly or through any chain of imports).
"""

from __future__ import annotations

import hashlib
from dataclasses import astuple, dataclass
from datetime import datetime
from typing import Protocol

from psych_sidecar.domain.errors import field_invalid, field_required
from psych_sidecar.domain.runlog import RunService, new_id, validate_request_id

MAX_MODEL_LENGTH = 256
# The contract's totals are int64: a Run's sum of any one count must stay at or below this.
MAX_TOTAL = 2**63 - 1
_TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


@dataclass(frozen=True, slots=True)
class ModelCallUsage:
    """One model call's usage, exactly as the provider reported it."""

    model: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int

    def fingerprint(self) -> str:
        return hashlib.sha256(repr(astuple(self)).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class UsageTotals:
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def plus(self, usage: ModelCallUsage) -> UsageTotals:
        """These totals with one more model call; a total that would pass int64's maximum
        (what the contract's fields hold) is FIELD_INVALID on the field that would overflow,
        and nothing is stored."""
        added = UsageTotals(
            self.model_calls + 1,
            self.input_tokens + usage.input_tokens,
            self.output_tokens + usage.output_tokens,
            self.cache_read_tokens + usage.cache_read_tokens,
            self.cache_write_tokens + usage.cache_write_tokens,
        )
        for name in _TOKEN_FIELDS:
            if getattr(added, name) > MAX_TOTAL:
                raise field_invalid(
                    name, f"the Run's {name} total would exceed {MAX_TOTAL} (int64)"
                )
        return added

    @property
    def cache_hit_ratio(self) -> float:
        """Cache reads over all input tokens (full rate, cache reads and cache writes)."""
        prompt = self.input_tokens + self.cache_read_tokens + self.cache_write_tokens
        return self.cache_read_tokens / prompt if prompt else 0.0


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """One recorded model call's usage and when it was recorded."""

    event_id: str
    usage: ModelCallUsage
    time: datetime


class UsageRepository(Protocol):
    def record_usage(
        self, run_id: str, event_id: str, usage: ModelCallUsage, fingerprint: str
    ) -> UsageTotals:
        """Store one event and return the Run's totals. An event id already stored with the
        same fingerprint stores nothing; with another fingerprint it is REQUEST_ID_REUSED."""
        ...

    def usage_totals(self, run_id: str) -> UsageTotals: ...

    def usage_events(self, run_id: str, limit: int) -> list[UsageEvent]:
        """The Run's newest `limit` events, oldest first."""
        ...


class UsageService:
    def __init__(self, runs: RunService, usage: UsageRepository) -> None:
        self._runs = runs
        self._usage = usage

    def record(self, run_id: str, request_id: str, usage: ModelCallUsage) -> UsageTotals:
        validate_request_id(request_id)
        if not usage.model:
            raise field_required("model")
        if len(usage.model) > MAX_MODEL_LENGTH or "\x00" in usage.model:
            raise field_invalid("model", f"must be at most {MAX_MODEL_LENGTH} characters, no NUL")
        for name in _TOKEN_FIELDS:
            if getattr(usage, name) < 0:
                raise field_invalid(name, "must not be negative")
        self._runs.get(run_id)
        event_id = request_id or new_id("u_")
        return self._usage.record_usage(run_id, event_id, usage, usage.fingerprint())

    def totals(self, run_id: str) -> UsageTotals:
        self._runs.get(run_id)
        return self._usage.usage_totals(run_id)

    def events(self, run_id: str, limit: int) -> list[UsageEvent]:
        self._runs.get(run_id)
        return self._usage.usage_events(run_id, limit)

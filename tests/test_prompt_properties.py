"""Property tests (hypothesis) of the estimator, elision, the zones and reading back, the
prompt ones over the real server on both databases."""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass
from typing import Any

from google.protobuf import timestamp_pb2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from psych.sidecar.v1 import content_pb2, run_service_pb2, spec_pb2, turn_pb2, turn_service_pb2
from psych_sidecar.domain.estimate import estimate_text_tokens, estimate_tokens
from tests.support.prompts import (
    append,
    assemble,
    assistant,
    binary,
    history_results,
    read,
    result,
    run_with,
    thresholds,
    valid_anthropic,
    valid_gemini,
    valid_openai,
    valid_openai_responses,
)
from tests.support.requests import user
from tests.support.sidecar import Stubs

SERVER_SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_names = itertools.count()


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}-{next(_names)}"


# The estimator


@given(st.text(), st.text())
def test_appending_text_never_lowers_the_estimate(text: str, more: str) -> None:
    assert estimate_text_tokens(text + more) >= estimate_text_tokens(text)
    assert estimate_text_tokens(text) == estimate_tokens(len(text.encode()))


@given(st.integers(min_value=0, max_value=2**62), st.integers(min_value=0, max_value=2**20))
def test_the_estimate_is_monotone_in_bytes(size: int, more: int) -> None:
    assert estimate_tokens(size + more) >= estimate_tokens(size) >= size / 4


# Tool results as hypothesis draws them

UNICODE = st.characters(blacklist_categories=["Cs"])


@st.composite
def long_text(draw: st.DrawFn, max_repeat: int = 400) -> str:
    """Text of any characters, long enough to cross small thresholds without drawing it all."""
    unit = draw(st.text(UNICODE, min_size=1, max_size=12))
    return (
        draw(st.text(UNICODE, max_size=20))
        + unit * draw(st.integers(0, max_repeat))
        + draw(st.text(UNICODE, max_size=20))
    )


@dataclass(frozen=True)
class Part:
    kind: str  # text | json | binary
    text: str = ""
    data: bytes = b""
    mime_type: str = ""

    def proto(self) -> content_pb2.ContentPart:
        if self.kind == "text":
            return content_pb2.ContentPart(text=self.text)
        if self.kind == "json":
            return content_pb2.ContentPart(json=self.text.encode())
        return binary(self.mime_type, self.data)

    def rendering(self) -> str:
        if self.kind == "binary":
            return f"[binary content: {self.mime_type}, {len(self.data)} bytes]"
        return self.text

    def stored_bytes(self) -> int:
        return len(self.data) if self.kind == "binary" else len(self.text.encode())


PARTS = st.one_of(
    long_text().map(lambda text: Part("text", text)),
    long_text(60).map(lambda text: Part("json", json.dumps({"value": text}, ensure_ascii=False))),
    st.builds(
        Part,
        st.just("binary"),
        data=st.binary(max_size=64).map(lambda b: b * 50),
        mime_type=st.sampled_from(["image/png", "application/octet-stream"]),
    ),
)


@dataclass(frozen=True)
class Result:
    parts: tuple[Part, ...]
    is_error: bool

    def rendering(self) -> str:
        return "\n".join(part.rendering() for part in self.parts)

    def stored_bytes(self) -> int:
        return sum(part.stored_bytes() for part in self.parts)


RESULTS = st.builds(Result, st.lists(PARTS, min_size=1, max_size=3).map(tuple), st.booleans())


@st.composite
def limits(draw: st.DrawFn) -> Any:
    per_result = draw(st.integers(1, 600))
    return thresholds(
        per_result_tokens=per_result,
        per_batch_tokens=draw(st.integers(per_result, 2000)),
        preview_head_chars=draw(st.integers(0, 80)),
        preview_tail_chars=draw(st.integers(0, 80)),
        failure_truncation_chars=draw(st.integers(1, 120)),
    )


def prior_turn(stubs: Stubs, run_id: str, results: list[Result]) -> list[str]:
    """Append a turn with these results and the user message after it; return the handles."""
    calls = [(f"c{i}", "tool", "{}") for i in range(len(results))]
    append(stubs, run_id, user("go"), assistant("", *calls))
    appended = append(
        stubs,
        run_id,
        *(
            result(call_id, *(p.proto() for p in r.parts), is_error=r.is_error)
            for (call_id, _, _), r in zip(calls, results, strict=True)
        ),
    )
    append(stubs, run_id, user("next"))
    return [entry.handle for entry in appended]


def read_back(stubs: Stubs, run_id: str, handle: str, limit: int) -> tuple[str, bytes]:
    """The whole result through its handle, page by page."""
    text, data, offset = [], [], 0
    while True:
        page = read(stubs, run_id, handle, offset=offset, limit=limit)
        text.append(page.text)
        data.append(page.data)
        if page.next_offset >= page.total_length:
            return "".join(text), b"".join(data)
        assert page.next_offset > offset
        offset = page.next_offset


@SERVER_SETTINGS
@given(
    results=st.lists(RESULTS, min_size=1, max_size=5),
    spec_limits=limits(),
    page=st.integers(0, 700),
)
def test_views_are_never_longer_and_elided_results_read_back_byte_for_byte(
    stubs: Stubs, results: list[Result], spec_limits: Any, page: int
) -> None:
    run_id = run_with(stubs, fresh("agent"), thresholds=spec_limits)
    handles = prior_turn(stubs, run_id, results)
    response = assemble(stubs, run_id)
    valid_anthropic(response.anthropic_request_json)
    valid_openai(response.openai_request_json)
    valid_openai_responses(response.openai_responses_request_json)
    valid_gemini(response.gemini_request_json)
    shown = history_results(response)
    for index, (stored, handle) in enumerate(zip(results, handles, strict=True)):
        view = shown[f"c{index}"]
        assert view.handle == handle
        if not view.elided:
            assert [c.SerializeToString() for c in view.content] == [
                p.proto().SerializeToString() for p in stored.parts
            ]
            continue
        (text,) = [c.text for c in view.content]
        assert len(text.encode()) < stored.stored_bytes()
        if not any(p.kind == "binary" for p in stored.parts):
            assert len(text) < len(stored.rendering())
        if stored.is_error:
            assert text == stored.rendering()[: spec_limits.failure_truncation_chars]
        whole_text, whole_data = read_back(stubs, run_id, handle, page)
        if len(stored.parts) == 1 and stored.parts[0].kind == "binary":
            assert (whole_text, whole_data) == ("", stored.parts[0].data)
        else:
            # Text and JSON parts come back exactly as stored, byte for byte.
            assert whole_text.encode() == stored.rendering().encode()
            assert whole_data == b""


@SERVER_SETTINGS
@given(results=st.lists(RESULTS, min_size=1, max_size=5), spec_limits=limits())
def test_elision_is_deterministic(stubs: Stubs, results: list[Result], spec_limits: Any) -> None:
    """The same log and Spec give the same prompt: again in the same Run, and in another Run
    holding the same records (up to its own handles)."""
    spec_name = fresh("agent")
    first = run_with(stubs, spec_name, thresholds=spec_limits)
    second = stubs.runs.CreateRun(
        run_service_pb2.CreateRunRequest(tenant="tenant-a", spec_name=spec_name, spec_version=1)
    ).run.run_id
    handles = [prior_turn(stubs, run, results) for run in (first, second)]
    one, again = assemble(stubs, first), assemble(stubs, first)
    assert one.SerializeToString(deterministic=True) == again.SerializeToString(deterministic=True)
    other = assemble(stubs, second)
    for field in (
        "anthropic_request_json",
        "openai_request_json",
        "openai_responses_request_json",
        "gemini_request_json",
    ):
        normalized = getattr(other, field)
        for mine, theirs in zip(handles[0], handles[1], strict=True):
            normalized = normalized.replace(theirs.encode(), mine.encode())
        assert normalized == getattr(one, field)
    assert [r.elided for r in history_results(one).values()] == [
        r.elided for r in history_results(other).values()
    ]


# Zones across the steps of a turn

STEP = st.lists(
    st.tuples(st.sampled_from([40, 300, 4000, 30_000]), st.booleans()), min_size=1, max_size=3
)
TURNS = st.lists(st.lists(STEP, min_size=1, max_size=4), min_size=2, max_size=4)


def _cache_blocks(body: bytes) -> list[bytes]:
    """The Anthropic request as the cache reads it: tools, system blocks, then each message's
    blocks with its role; cache_control markers are not content and are left out."""
    parsed = json.loads(body)

    def canonical(value: dict[str, Any], *prefix: str) -> bytes:
        stripped = {k: v for k, v in value.items() if k != "cache_control"}
        return json.dumps([*prefix, stripped], separators=(",", ":")).encode()

    blocks = [canonical(tool, "tool") for tool in parsed.get("tools", [])]
    blocks += [canonical(block, "system") for block in parsed.get("system", [])]
    for message in parsed["messages"]:
        blocks += [canonical(block, message["role"]) for block in message["content"]]
    return blocks


def _history_parts(response: turn_service_pb2.AssemblePromptResponse) -> list[bytes]:
    return [
        bytes([message.role]) + part.SerializeToString(deterministic=True)
        for message in response.prompt.history
        for part in message.parts
    ]


@SERVER_SETTINGS
@given(turns=TURNS, spec_limits=limits())
def test_zones_one_to_three_are_byte_identical_across_the_steps_of_a_turn(
    stubs: Stubs, turns: list[list[list[tuple[int, bool]]]], spec_limits: Any
) -> None:
    run_id = run_with(
        stubs,
        fresh("agent"),
        instructions="Be helpful.",
        capability_notes=["note"],
        thresholds=spec_limits,
    )
    calls = itertools.count()
    static_zones: set[tuple[str, str]] = set()
    for turn_index, steps in enumerate(turns):
        append(stubs, run_id, user(f"turn {turn_index}"))
        previous = assemble(stubs, run_id, dynamic_tail="memory", now=_tick(turn_index, 0))
        static_zones.add((previous.zones[0].sha256, previous.zones[1].sha256))
        for step_index, step in enumerate(steps):
            ids = [f"call{next(calls)}" for _ in step]
            append(stubs, run_id, assistant("", *((i, "tool", "{}") for i in ids)))
            append(
                stubs,
                run_id,
                *(
                    result(i, ("é" if is_error else "x") * size, is_error=is_error)
                    for i, (size, is_error) in zip(ids, step, strict=True)
                ),
            )
            current = assemble(
                stubs, run_id, dynamic_tail="memory", now=_tick(turn_index, step_index + 1)
            )
            static_zones.add((current.zones[0].sha256, current.zones[1].sha256))
            before, after = _history_parts(previous), _history_parts(current)
            assert after[: len(before)] == before
            sent, now_sent = (
                _cache_blocks(previous.anthropic_request_json),
                _cache_blocks(current.anthropic_request_json),
            )
            assert now_sent[: len(sent) - 1] == sent[:-1]  # all but the transient block
            assert current.prompt.transient.role == turn_pb2.PROMPT_ROLE_USER
            previous = current
    assert len(static_zones) == 1


def _tick(turn: int, step: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=1_796_126_400 + 3600 * turn + 7 * step)


# The context guard across the steps of a turn

# Results of a few hundred KB: two or three of them in one turn cross any window drawn below.
HEAVY_STEP = st.lists(
    st.sampled_from([900, 20_000, 150_000, 300_000, 450_000]), min_size=1, max_size=3
)
HEAVY_TURNS = st.lists(st.lists(HEAVY_STEP, min_size=2, max_size=5), min_size=1, max_size=3)


def _openai_messages(body: bytes) -> list[Any]:
    return list(json.loads(body)["messages"])


@SERVER_SETTINGS
@given(turns=HEAVY_TURNS, window=st.integers(40_000, 260_000))
# Two equal results in consecutive steps: eliding the earlier one would rewrite the history.
@example(turns=[[[300_000], [300_000]]], window=120_000)
# Steps that cannot fit by eliding their own results alone: an earlier one goes, once.
@example(turns=[[[150_000], [20_000] * 3, [20_000] * 3, [20_000] * 3, [900] * 3]], window=60_000)
def test_the_context_guard_keeps_each_call_a_byte_prefix_of_the_next(
    stubs: Stubs, turns: list[list[list[int]]], window: int
) -> None:
    """With several results of a few hundred KB in a turn, whatever the window: every call's
    body starts with the previous call's, all but its trailing transient block (Anthropic)
    or message (OpenAI), except at most two steps of a turn where no newer result could make
    room; and every body fits the budget."""
    run_id = run_with(stubs, fresh("agent"), instructions="Be helpful.")
    budget = spec_pb2.ContextBudget(context_window_tokens=window)
    calls = itertools.count()
    for turn_index, steps in enumerate(turns):
        append(stubs, run_id, user(f"turn {turn_index}"))
        previous = assemble(stubs, run_id, context_budget=budget, now=_tick(turn_index, 0))
        misses = 0
        for step_index, sizes in enumerate(steps):
            ids = [f"call{next(calls)}" for _ in sizes]
            append(stubs, run_id, assistant("", *((i, "tool", "{}") for i in ids)))
            append(
                stubs,
                run_id,
                *(result(i, f"{i}:" + "x" * size) for i, size in zip(ids, sizes, strict=True)),
            )
            current = assemble(
                stubs, run_id, context_budget=budget, now=_tick(turn_index, step_index + 1)
            )
            guard = current.context_guard
            assert guard.estimated_tokens <= window - 4096
            sent = _cache_blocks(previous.anthropic_request_json)
            now_sent = _cache_blocks(current.anthropic_request_json)
            kept = now_sent[: len(sent) - 1] == sent[:-1]
            before = _openai_messages(previous.openai_request_json)
            after = _openai_messages(current.openai_request_json)
            assert (after[: len(before) - 1] == before[:-1]) == kept
            if not kept:
                # Only when the results added since the previous call could not make room
                # on their own (all of them are elided); and rarely (see docs/prompt.md).
                misses += 1
                shown = history_results(current)
                assert all(shown[i].elided for i in ids if sizes[ids.index(i)] > 900)
            previous = current
        assert misses <= 2

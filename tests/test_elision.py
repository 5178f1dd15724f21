"""The spec's elision rules, case by case, over the real server on both databases.

Thresholds are small so the cases stay small: a result of 4·n ASCII characters is estimated
at exactly n tokens (ceil(UTF-8 bytes / 4)).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from psych.sidecar.v1 import content_pb2
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
    valid_openai,
)
from tests.support.requests import user
from tests.support.sidecar import Stubs

LIMITS = thresholds(
    per_result_tokens=1000,
    per_batch_tokens=2500,
    preview_head_chars=100,
    preview_tail_chars=50,
    failure_truncation_chars=80,
)


def text_of(tokens: int, seed: str = "x") -> str:
    """Exactly `tokens` estimated tokens of varied ASCII text."""
    pattern = f"{seed}-line of output {seed}\n"
    return (pattern * (4 * tokens // len(pattern) + 1))[: 4 * tokens]


def turn_with_results(stubs: Stubs, run_id: str, *contents: str, is_error: bool = False) -> None:
    """One turn: a user message, one assistant message calling a tool per content, the
    results; then the next user message, which puts this turn behind the boundary."""
    calls = [(f"c{i}-{run_id[-6:]}", "tool", "{}") for i in range(len(contents))]
    append(
        stubs,
        run_id,
        user("do it"),
        assistant("", *calls),
        *(
            result(c, text, is_error=is_error)
            for (c, _, _), text in zip(calls, contents, strict=True)
        ),
        user("next"),
    )


def elided_sizes(stubs: Stubs, run_id: str) -> list[int]:
    """The token sizes (by content length) of the results the prompt shows elided."""
    results = history_results(assemble(stubs, run_id))
    return sorted(
        int(re.search(r"(\d+) characters in full", r.content[0].text).group(1)) // 4  # type: ignore[union-attr]
        for r in results.values()
        if r.elided
    )


def test_a_batch_summing_under_the_per_result_threshold_is_left_alone(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), thresholds=LIMITS)
    turn_with_results(stubs, run_id, text_of(300), text_of(300), text_of(399))
    results = history_results(assemble(stubs, run_id)).values()
    assert [r.elided for r in results] == [False, False, False]
    assert [len(r.content[0].text) for r in results] == [1200, 1200, 1596]


def test_many_small_results_that_add_up_are_still_processed_largest_first(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    # None reaches the per-result threshold, but together they exceed the batch threshold:
    # the largest goes first, and eliding stops once the running total is under 2500.
    run_id = run_with(stubs, unique("agent"), thresholds=LIMITS)
    turn_with_results(stubs, run_id, text_of(600), text_of(950), text_of(700), text_of(900))
    assert elided_sizes(stubs, run_id) == [950]


def test_every_result_at_or_over_the_per_result_threshold_is_elided(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), thresholds=LIMITS)
    turn_with_results(stubs, run_id, text_of(999), text_of(1000), text_of(5000))
    assert elided_sizes(stubs, run_id) == [1000, 5000]


def test_after_the_per_result_rule_the_largest_go_until_the_total_is_under_the_batch(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    # 1500 is elided by the per-result rule (its preview is about 105 tokens); the running
    # total 105 + 950 + 850 + 750 = 2655 is still over 2500, so the largest remaining, 950,
    # goes too, which brings it under.
    run_id = run_with(stubs, unique("agent"), thresholds=LIMITS)
    turn_with_results(stubs, run_id, text_of(750), text_of(1500), text_of(850), text_of(950))
    assert elided_sizes(stubs, run_id) == [950, 1500]


def test_a_preview_shows_head_omission_tail_and_guidance_and_reads_back_in_full(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), thresholds=LIMITS)
    content = "Ünïcødé 🙂 " + "".join(f"line {i} ✓\n" for i in range(2000))
    turn_with_results(stubs, run_id, content)
    (shown,) = history_results(assemble(stubs, run_id)).values()
    assert shown.elided
    assert shown.handle.startswith("h_")
    text = shown.content[0].text
    omitted = len(content) - 150
    assert text == (
        content[:100]
        + f"\n[... {omitted} characters omitted ...]\n"
        + content[-50:]
        + f"\n[Elided from this prompt: {len(content)} characters in full. Read the rest with "
        f'read_tool_output(handle="{shown.handle}"): offset 100 continues after the head; '
        "offset and limit count characters; grep takes an RE2 pattern.]"
    )
    assert len(text) < len(content)
    back = read(stubs, run_id, shown.handle)
    assert (back.text, back.total_length, back.next_offset) == (content, len(content), len(content))
    assert read(stubs, run_id, shown.handle, offset=100, limit=7).text == content[100:107]


def test_a_preview_spans_the_parts_of_a_result(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"), thresholds=LIMITS)
    parts = [
        content_pb2.ContentPart(text="short head part"),
        binary("image/png", b"\x89PNG" + bytes(6000)),
        content_pb2.ContentPart(json=b'{"k": "' + b"v" * 3000 + b'"}'),
    ]
    append(
        stubs, run_id, user("go"), assistant("", ("c1", "t", "{}")), result("c1", *parts), user("n")
    )
    (shown,) = history_results(assemble(stubs, run_id)).values()
    rendering = (
        "short head part\n[binary content: image/png, 6004 bytes]\n" + '{"k": "' + "v" * 3000 + '"}'
    )
    assert shown.elided
    assert shown.content[0].text.startswith(rendering[:100] + "\n[... ")
    back = read(stubs, run_id, shown.handle)
    assert back.text == rendering


def test_content_too_short_for_a_preview_goes_through_unchanged(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    # Every result here is at or over the 10-token per-result threshold, but head (100) and
    # tail (50) would overlap on 140 characters, and on 300 the preview (with its guidance)
    # would not be shorter: both go through unchanged. 3000 characters are previewed.
    tiny = thresholds(
        per_result_tokens=10, per_batch_tokens=10, preview_head_chars=100, preview_tail_chars=50
    )
    run_id = run_with(stubs, unique("agent"), thresholds=tiny)
    contents = [text_of(35), text_of(75), text_of(750)]
    turn_with_results(stubs, run_id, *contents)
    results = list(history_results(assemble(stubs, run_id)).values())
    assert [r.elided for r in results] == [False, False, True]
    assert [r.content[0].text for r in results[:2]] == contents[:2]
    assert len(results[2].content[0].text) < len(contents[2])


def test_a_failure_is_truncated_from_the_top_without_marker_or_guidance(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), thresholds=LIMITS)
    trace = "Traceback (most recent call last):\n" + text_of(2000, "frame")
    turn_with_results(stubs, run_id, trace, is_error=True)
    response = assemble(stubs, run_id)
    (shown,) = history_results(response).values()
    assert (shown.elided, shown.is_error) == (True, True)
    assert [c.text for c in shown.content] == [trace[:80]]
    assert shown.handle
    body = valid_anthropic(response.anthropic_request_json)
    failure = [b for m in body["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert failure[0]["content"] == [{"type": "text", "text": trace[:80]}]
    assert failure[0]["is_error"] is True
    valid_openai(response.openai_request_json)
    assert read(stubs, run_id, shown.handle).text == trace


def test_a_short_failure_is_not_truncated(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(
        stubs, unique("agent"), thresholds=thresholds(per_result_tokens=5, per_batch_tokens=5)
    )
    turn_with_results(stubs, run_id, "Error: 42 is not a port", is_error=True)
    (shown,) = history_results(assemble(stubs, run_id)).values()
    assert (shown.elided, shown.content[0].text) == (False, "Error: 42 is not a port")


def test_the_current_turn_goes_in_full_and_its_view_changes_once_at_the_next_turn(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), thresholds=LIMITS)
    huge = text_of(20_000)
    append(stubs, run_id, user("fetch"), assistant("", ("big", "t", "{}")), result("big", huge))
    current = history_results(assemble(stubs, run_id))["big"]
    assert (current.elided, current.content[0].text) == (False, huge)
    append(stubs, run_id, assistant("", ("more", "t", "{}")), result("more", text_of(5000)))
    assert history_results(assemble(stubs, run_id))["big"].content[0].text == huge

    append(stubs, run_id, user("thanks; next question"))
    views = []
    for step in range(3):
        views.append(history_results(assemble(stubs, run_id))["big"])
        append(stubs, run_id, assistant("", (f"s{step}", "t", "{}")), result(f"s{step}", huge))
    assert views[0].elided
    assert views[0] == views[1] == views[2]


def test_binary_content_of_an_earlier_turn_is_left_out_behind_its_marker(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"), thresholds=LIMITS)
    png = b"\x89PNG" + bytes(20_000)
    append(
        stubs,
        run_id,
        user("plot it"),
        assistant("", ("c1", "plot", "{}"), ("c2", "plot", "{}")),
        result("c1", "chart:", binary("image/png", png)),
        result("c2", binary("image/png", png), is_error=True),
        user("next"),
    )
    response = assemble(stubs, run_id)
    shown = history_results(response)
    assert shown["c1"].elided
    assert shown["c1"].content[0].text == (
        "chart:\n[binary content: image/png, 20004 bytes]\n[Binary content is not repeated in "
        f'this prompt; read_tool_output(handle="{shown["c1"].handle}") returns it.]'
    )
    assert shown["c2"].elided
    assert shown["c2"].content[0].text == "[binary content: image/png, 20004 bytes]"
    assert b"iVBO" not in response.anthropic_request_json
    valid_anthropic(response.anthropic_request_json)
    valid_openai(response.openai_request_json)

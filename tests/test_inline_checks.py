"""What the event loop judges itself and what goes to a worker thread: a small value against a
compiled schema with no regular expression, a small result; everything else off the loop."""

from __future__ import annotations

import mcp_types as types

from psych_sidecar.domain.calls import (
    MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP,
    MAX_RESULT_CHARS_CONVERTED_ON_LOOP,
    SchemaValidators,
    json_within,
)
from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.mcp.result_parts import small_result

PLAIN = canonical_json({"type": "object", "properties": {"text": {"type": "string"}}})
WITH_PATTERN = canonical_json(
    {"type": "object", "properties": {"text": {"type": "string", "pattern": "^(a+)+$"}}}
)


def test_json_within_counts_strings_keys_and_members() -> None:
    assert json_within({"text": "x" * 10}, 16)
    assert not json_within({"text": "x" * 10}, 14)
    assert json_within([1, 2, 3], 7)
    assert not json_within([1, 2, 3], 6)
    assert not json_within(list(range(10**6)), MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP)
    assert not json_within(
        {"deep": [{"text": "y" * MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP}]},
        MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP,
    )


def test_a_check_is_quick_only_once_compiled_with_no_pattern_and_for_a_small_value() -> None:
    validators = SchemaValidators()
    small = {"text": "hello"}
    assert not validators.quick(PLAIN, small)  # not compiled yet
    assert validators.errors(PLAIN, small) == []
    assert validators.quick(PLAIN, small)
    assert not validators.quick(PLAIN, {"text": "x" * (MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP + 1)})
    assert validators.errors(WITH_PATTERN, {"text": "aaa"}) == []
    assert not validators.quick(WITH_PATTERN, {"text": "aaa"})
    # A property named like the keyword errs on the side of the worker thread.
    named = canonical_json({"type": "object", "properties": {"pattern": {"type": "string"}}})
    validators.errors(named, small)
    assert not validators.quick(named, small)


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def test_a_result_is_small_by_its_texts_data_and_structured_content() -> None:
    assert small_result(types.CallToolResult(content=[_text("hello")]))
    big = "x" * (MAX_RESULT_CHARS_CONVERTED_ON_LOOP + 1)
    assert not small_result(types.CallToolResult(content=[_text(big)]))
    half = "x" * (MAX_RESULT_CHARS_CONVERTED_ON_LOOP // 2 + 1)
    assert not small_result(types.CallToolResult(content=[_text(half), _text(half)]))
    image = types.ImageContent(type="image", data=big, mime_type="image/png")
    assert not small_result(types.CallToolResult(content=[image]))
    structured = types.CallToolResult(content=[], structured_content={"y": big})
    assert not small_result(structured)
    link = types.ResourceLink(type="resource_link", uri="file:///a", name="a")
    assert not small_result(types.CallToolResult(content=[link]))  # sized only by its dump

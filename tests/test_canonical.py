"""The canonical JSON spelling, and its sliced form for values carrying very long strings:
the same bytes, whatever the slice boundaries cut through."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psych_sidecar.domain import canonical
from psych_sidecar.domain.canonical import (
    b64encode_sliced,
    canonical_json,
    canonical_json_sliced,
    utf8_sliced,
)

# Small slices, so that short generated strings are "long" and every boundary is exercised.
SLICE = 7

json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=40)
json_values = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture(autouse=True)
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(canonical, "SLICE_CHARS", SLICE)


@given(json_values)
def test_sliced_is_byte_for_byte_canonical(value: Any) -> None:
    assert canonical_json_sliced(value) == canonical_json(value)


@given(st.text())
def test_utf8_sliced_is_encode(text: str) -> None:
    assert utf8_sliced(text) == text.encode()


@given(st.binary(max_size=60))
def test_b64encode_sliced_is_b64encode(raw: bytes) -> None:
    # SLICE characters of base64 are 3 whole bytes a slice.
    assert b64encode_sliced(raw) == base64.b64encode(raw).decode()


def test_a_result_with_long_texts_escapes_across_slice_boundaries() -> None:
    tricky = 'é"\\\n\t\x00\x1f😀/' * 5  # escapes and multi-byte characters cut by slices
    result = {
        "content": [
            {"type": "text", "text": tricky},
            {"type": "text", "text": "short"},
            {"type": "text", "text": tricky[::-1]},
        ],
        "structuredContent": {"deep": {"deeper": {"deepest": [tricky]}}},
        "isError": False,
    }
    assert canonical_json_sliced(result) == canonical_json(result)


def test_a_string_spelled_like_the_placeholder_is_kept_as_sent() -> None:
    # The placeholder is random per call: a party cannot send one that would be replaced.
    lookalike = "\x00" + "0" * 32 + "\x00"
    value = {"a": "x" * (SLICE * 3), "b": lookalike, lookalike: "y" * (SLICE + 1)}
    assert canonical_json_sliced(value) == canonical_json(value)


def test_nan_is_refused_as_by_canonical_json() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        canonical_json_sliced({"text": "x" * (SLICE * 2), "n": float("nan")})

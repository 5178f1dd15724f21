"""Sliced helpers give what the one call gives: the canonical JSON spelling of values carrying
very long strings, text encoding, base64 both ways and the count of UTF-8 characters, whatever
the slice boundaries cut through (and base64 refuses the same data as one decode of the whole)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psych_sidecar.bulk.slices import (
    b64decode_sliced,
    b64encode_sliced,
    json_sliced,
    needs_no_json_escape,
    utf8_char_count,
    utf8_sliced,
)
from psych_sidecar.domain.canonical import canonical_json

# Small slices, so that short generated strings are "long" and every boundary is exercised;
# a whole number of 4-character groups of base64 (3 bytes), as the real size is.
SLICE = 8

json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=40)
json_values = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def canonical_json_sliced(value: Any) -> bytes:
    return json_sliced(value, canonical_json, slice_chars=SLICE)


@given(json_values)
def test_sliced_is_byte_for_byte_canonical(value: Any) -> None:
    assert canonical_json_sliced(value) == canonical_json(value)


@given(st.text())
def test_utf8_sliced_is_encode(text: str) -> None:
    assert utf8_sliced(text, slice_chars=SLICE) == text.encode()


@given(st.text())
def test_utf8_char_count_counts_the_characters(text: str) -> None:
    assert utf8_char_count(text.encode(), slice_chars=SLICE) == len(text)


@given(st.binary(max_size=60))
def test_b64encode_sliced_is_b64encode(raw: bytes) -> None:
    assert b64encode_sliced(raw, slice_chars=SLICE) == base64.b64encode(raw).decode()


base64ish = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefgh0123456789+/=- é\n", max_size=60)


def _whole(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def _sliced(data: str) -> bytes | None:
    try:
        return b64decode_sliced(data, slice_chars=SLICE)
    except (binascii.Error, ValueError):
        return None


@given(st.binary(max_size=80))
def test_base64_of_any_bytes_decodes_to_them(raw: bytes) -> None:
    assert b64decode_sliced(base64.b64encode(raw).decode(), slice_chars=SLICE) == raw


@given(base64ish)
def test_sliced_decoding_accepts_and_refuses_what_the_whole_does(data: str) -> None:
    assert _sliced(data) == _whole(data)


@pytest.mark.parametrize(
    "data",
    [
        "QUFB" + "QQ==" + "QUFB",  # padding mid-way, in a slice that is not the last
        "QUFBQUFB" + "QQ==QUFB",  # padding mid-way, in the last slice
        "QUFBQUF",  # not a whole group at the end
        "QUFBQUFB\nQUFB",  # a newline, which validate refuses
    ],
)
def test_malformed_base64_is_refused(data: str) -> None:
    assert _whole(data) is None
    assert _sliced(data) is None


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


encodable_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]))


@given(encodable_text)
def test_text_needs_no_escape_exactly_when_json_spells_it_as_its_utf8(text: str) -> None:
    data = text.encode()
    assert needs_no_json_escape(data, slice_chars=SLICE) == (
        canonical_json(text) == b'"' + data + b'"'
    )


@given(st.lists(encodable_text, min_size=1, max_size=4))
def test_texts_spelled_from_their_bytes_give_the_same_json(texts: list[str]) -> None:
    result = {"content": [{"type": "text", "text": text} for text in texts], "isError": False}
    plain = [(t, t.encode()) for t in texts if needs_no_json_escape(t.encode(), slice_chars=SLICE)]
    assert json_sliced(result, canonical_json, plain, slice_chars=SLICE) == canonical_json(result)


def test_a_plain_text_is_spelled_from_its_bytes_not_encoded_again() -> None:
    text = "plain text, nothing to escape " * 2
    # Bytes that are not the text's own show where the JSON's spelling came from.
    stand_in = b"B" * len(text)
    result = {"content": [{"type": "text", "text": text}]}
    assert json_sliced(result, canonical_json, [(text, stand_in)], slice_chars=SLICE) == (
        b'{"content":[{"type":"text","text":"' + stand_in + b'"}]}'
    )
    # An equal string that is not the same object is encoded as usual.
    assert json_sliced(result, canonical_json, [("".join(text), stand_in)], slice_chars=SLICE) == (
        canonical_json(result)
    )


def test_nan_is_refused_as_by_canonical_json() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        canonical_json_sliced({"text": "x" * (SLICE * 2), "n": float("nan")})

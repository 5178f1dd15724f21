"""MCP results as log parts: base64 decoded in slices gives the same bytes, and refuses the
same data, as one decode of the whole, wherever the slice boundaries fall."""

from __future__ import annotations

import base64
import binascii

import mcp_types as types
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.runlog import PartKind
from psych_sidecar.mcp import results

# Small slices (a whole number of 4-character groups), so that every boundary is exercised.
SLICE = 8

base64ish = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefgh0123456789+/=- é\n", max_size=60)


@pytest.fixture(autouse=True)
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "SLICE_CHARS", SLICE)


def _whole(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def _sliced(data: str) -> bytes | None:
    try:
        return results.b64decode_sliced(data)
    except (binascii.Error, ValueError):
        return None


@given(st.binary(max_size=80))
def test_base64_of_any_bytes_decodes_to_them(raw: bytes) -> None:
    assert results.b64decode_sliced(base64.b64encode(raw).decode()) == raw


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


def test_a_long_image_is_stored_as_its_bytes_and_a_malformed_one_as_sent() -> None:
    raw = bytes(range(256)) * 3
    image = types.ImageContent(
        type="image", data=base64.b64encode(raw).decode(), mime_type="image/png"
    )
    part = results.content_part(image)
    assert (part.kind, part.data, part.mime_type) == (PartKind.BINARY, raw, "image/png")
    broken = types.ImageContent(type="image", data="QQ==" * 40, mime_type="image/png")
    part = results.content_part(broken)
    assert part.kind is PartKind.JSON
    assert part.data == canonical_json(results._dump(broken))

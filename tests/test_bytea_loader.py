"""PostgreSQL's bytea read as text and unescaped a slice at a time: the same bytes as libpq's
unescaping, wherever the slices fall, and anything not in hex left to libpq."""

from __future__ import annotations

import psycopg
import psycopg.pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from psych_sidecar.storage import bytea_loader

BYTEA = psycopg.postgres.types["bytea"].oid
_libpq = psycopg.pq.Escaping()


def _load(text: bytes) -> bytes:
    # psycopg hands a loader a memoryview over the result's buffer. Three bytes a slice.
    loader = bytea_loader.SlicedByteaLoader(BYTEA, sliced_hex_bytes=6)
    return loader.load(memoryview(text))


@given(st.binary(max_size=50))
def test_hex_unescapes_as_libpq_does(raw: bytes) -> None:
    text = b"\\x" + raw.hex().encode()
    assert _load(text) == _libpq.unescape_bytea(text) == raw


@pytest.mark.parametrize("text", [b"abc\\\\def\\001ghijkl", b"plain text, no escapes"])
def test_the_escape_format_is_left_to_libpq(text: bytes) -> None:
    assert _load(text) == _libpq.unescape_bytea(text)

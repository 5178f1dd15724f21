"""A large bytes field added to a serialized protobuf message at the wire level.

Setting tens of MB on a message and serializing it are two long calls that hold the GIL,
stalling the event loop though they run on a worker thread (building a 50 MB response took
~100 ms). The wire format lets a message be serialized without the value, and the value
added after it as a second occurrence of the enclosing message field, which parsers merge
into the first (protobuf encoding: "Last One Wins" and the merging of embedded messages). The
one copy of the value is then a bytes join, which releases the GIL while it copies.
"""

from __future__ import annotations

__all__ = ["with_nested_bytes"]

# The wire type of bytes, strings and embedded messages.
_LENGTH_DELIMITED = 2


def with_nested_bytes(head: bytes, outer_field: int, inner_field: int, value: bytes) -> bytes:
    """`head`, a serialized message, with `value` as bytes field `inner_field` of its message
    field `outer_field`: what serializing the message with that field set would give, to
    any parser. `outer_field` must be a singular message field, `inner_field` a singular
    bytes or string field, unset in `head`."""
    inner_key = _key(inner_field)
    value_length = _varint(len(value))
    return b"".join(
        (
            head,
            _key(outer_field),
            _varint(len(inner_key) + len(value_length) + len(value)),
            inner_key,
            value_length,
            value,
        )
    )


def _key(field_number: int) -> bytes:
    return _varint(field_number << 3 | _LENGTH_DELIMITED)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)

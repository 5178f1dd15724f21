"""Opaque page tokens: a position plus the request scope they were issued for."""

from __future__ import annotations

import base64
import binascii
import json

from psych_sidecar.domain.errors import field_invalid

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def page_size(
    requested: int, default: int = DEFAULT_PAGE_SIZE, maximum: int = MAX_PAGE_SIZE
) -> int:
    if requested < 0:
        raise field_invalid("page_size", "must not be negative")
    if requested == 0:
        return default
    return min(requested, maximum)


def encode_token(scope: str, position: str | int) -> str:
    raw = json.dumps([scope, position], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, scope: str) -> str | int | None:
    """The position a token points at, or None for the first page.

    A token issued for another scope (another Run, say) is refused, never reinterpreted.
    """
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        token_scope, position = json.loads(raw)
    except (ValueError, binascii.Error, TypeError):
        raise field_invalid("page_token", "not a token this sidecar issued") from None
    if token_scope != scope or not isinstance(position, str | int):
        raise field_invalid("page_token", "issued for a different request")
    return position

"""The key ring and the envelope of a stored secret.

An envelope is text (it lives in text columns): ``sealed:`` then the base64 of

    version (1 byte, 1) | key id (8 bytes) | nonce (12 bytes) | AES-256-GCM ciphertext + tag

The associated data is the version and key id followed by the value's *context*, the place it
is stored (table, row key, field), so a ciphertext copied to another row or field, or relabelled
with another key id, fails to open instead of decrypting there.

A key's id is derived from the key (a hash prefix), never chosen: the same key has the same id
in every sidecar, and a wrong key can never pass for the right one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

ENVELOPE_PREFIX = "sealed:"
_VERSION = 1
KEY_BYTES = 32
_KEY_ID_BYTES = 8
_NONCE_BYTES = 12
_HEADER_BYTES = 1 + _KEY_ID_BYTES
_KEY_ID_LABEL = b"psych-sidecar secret key id\x00"


class SecretUnreadable(Exception):
    """A stored secret that cannot be opened: its key is not configured, or it is not an
    envelope of this format, or it fails authentication (a wrong key, a value moved from
    another row, a corrupted value). The message names the key id, never a secret."""


def key_id(key: bytes) -> str:
    """A key's id, 16 hex digits: the same key has the same id everywhere."""
    return hashlib.sha256(_KEY_ID_LABEL + key).digest()[:_KEY_ID_BYTES].hex()


def context(*parts: str) -> bytes:
    """The associated data naming where a value is stored, e.g. ("connections", tenant, name,
    "env"). JSON, so that no two different lists of parts encode alike."""
    return json.dumps(list(parts), ensure_ascii=False, separators=(",", ":")).encode()


def is_sealed(stored: str) -> bool:
    return stored.startswith(ENVELOPE_PREFIX)


def envelope_key_id(stored: str) -> str:
    """The id of the key an envelope was sealed with (nothing is decrypted)."""
    return _split(stored)[0][1:].hex()


def _split(stored: str) -> tuple[bytes, bytes, bytes]:
    """(header, nonce, ciphertext) of an envelope."""
    if not is_sealed(stored):
        raise SecretUnreadable("a stored secret is not sealed (plaintext from before encryption)")
    try:
        raw = base64.b64decode(stored.removeprefix(ENVELOPE_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise SecretUnreadable("a stored secret is not a valid envelope") from None
    if len(raw) < _HEADER_BYTES + _NONCE_BYTES + 16 or raw[0] != _VERSION:
        raise SecretUnreadable("a stored secret is not an envelope of a known version")
    sealed_from = _HEADER_BYTES + _NONCE_BYTES
    return raw[:_HEADER_BYTES], raw[_HEADER_BYTES:sealed_from], raw[sealed_from:]


class _Key:
    """A configured key. Its cipher is made when it first seals or opens: a sidecar that
    stores no secret does not load cryptography to start."""

    __slots__ = ("_cipher", "_secret", "id")

    def __init__(self, secret: bytes) -> None:
        self.id = key_id(secret)
        self._secret = secret
        self._cipher: AESGCM | None = None

    @property
    def cipher(self) -> AESGCM:
        if self._cipher is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._cipher = AESGCM(self._secret)
        return self._cipher


class KeyRing:
    """The operator's keys: every one opens what it sealed; the first (the primary) seals."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a key ring needs at least one key")
        ring: dict[str, _Key] = {}
        for key in keys:
            if len(key) != KEY_BYTES:
                raise ValueError(f"a secret key is {KEY_BYTES} bytes, not {len(key)}")
            ring.setdefault(key_id(key), _Key(key))
        self._keys = ring
        self._primary = ring[key_id(keys[0])]

    @property
    def primary_id(self) -> str:
        return self._primary.id

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key's id, the primary first."""
        return tuple(self._keys)

    def seal(self, plaintext: str, where: bytes) -> str:
        """An envelope of `plaintext` under the primary key, bound to `where` (see context)."""
        header = bytes([_VERSION]) + bytes.fromhex(self._primary.id)
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._primary.cipher.encrypt(nonce, plaintext.encode(), header + where)
        return ENVELOPE_PREFIX + base64.b64encode(header + nonce + sealed).decode("ascii")

    def open(self, stored: str, where: bytes) -> str:
        """The plaintext of an envelope sealed for `where`; SecretUnreadable otherwise."""
        header, nonce, sealed = _split(stored)
        wanted = header[1:].hex()
        key = self._keys.get(wanted)
        if key is None:
            raise SecretUnreadable(
                f"a stored secret is sealed with key {wanted}, which is not configured "
                f"(configured: {', '.join(self._keys)})"
            )
        cipher = key.cipher
        from cryptography.exceptions import InvalidTag

        try:
            return cipher.decrypt(nonce, sealed, header + where).decode()
        except InvalidTag:
            raise SecretUnreadable(
                f"a stored secret under key {wanted} fails authentication (altered, or moved "
                "from another row)"
            ) from None

    def needs_resealing(self, stored: str) -> bool:
        """Whether an envelope is under a key other than the primary."""
        return envelope_key_id(stored) != self._primary.id

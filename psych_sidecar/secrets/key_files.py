"""Keys as text, key files, and the key file the sidecar makes beside a SQLite database.

A key is 32 random bytes written in base64 (``head -c 32 /dev/urandom | base64``). A key file
holds one key a line, the primary (the one that seals) first; blank lines and lines starting
with ``#`` are ignored. No message here ever quotes a key.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from psych_sidecar.secrets.cipher import KEY_BYTES, KeyRing


class KeyFileError(Exception):
    """A key or key file that cannot be used; the message says which, in one line."""


def parse_key(text: str, where: str) -> bytes:
    """One key from its base64 text; `where` names its source in the error (never the key)."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyFileError(f"{where}: a secret key is base64 text") from None
    if len(key) != KEY_BYTES:
        raise KeyFileError(
            f"{where}: a secret key is {KEY_BYTES} bytes in base64 (head -c 32 /dev/urandom | "
            f"base64), this one is {len(key)}"
        )
    return key


def read_key_file(path: Path) -> list[bytes]:
    """The keys of a key file, the primary first."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as error:
        raise KeyFileError(f"cannot read the secret key file {path}: {error}") from None
    keys = [
        parse_key(line, f"{path} line {number}")
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not keys:
        raise KeyFileError(f"the secret key file {path} holds no key")
    return keys


def create_key_file(path: Path) -> bool:
    """Write a new random key to `path` (mode 0600) unless a file is there already; True when
    this call made it. Atomic: the key is written to a temporary file that is then hard-linked
    into place, which fails if `path` exists, so a file another sidecar made at the same
    moment is never overwritten and no reader ever sees a half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as file:
            file.write(
                "# psych-sidecar's secret keys, one a line, the first seals (docs/operations.md,"
                " Keys)\n"
            )
            file.write(base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii") + "\n")
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def parse_key_list(text: str, where: str) -> list[bytes]:
    """Keys written one after another, separated by commas (the environment's form)."""
    return [
        parse_key(item, f"{where}, key {number}")
        for number, item in enumerate(text.split(","), start=1)
        if item.strip()
    ]


def default_key_file(database_file: Path) -> Path:
    """Where the sidecar keeps the key it makes for a SQLite database: beside it."""
    return database_file.with_name(database_file.name + ".keys")


@dataclass(frozen=True, slots=True)
class LoadedKeys:
    ring: KeyRing
    created: Path | None  # the key file made by this load, if one was


def load_keys(listed: str, key_file: Path | None, sqlite_file: Path | None) -> LoadedKeys:
    """The key ring from the operator's settings: the `listed` keys (comma-separated), then
    the `key_file`'s; the first of them all seals. With neither, a SQLite database gets the key
    file beside it (made now if missing); any other database is refused, naming what to set."""
    keys = parse_key_list(listed, "secret_keys") if listed.strip() else []
    created: Path | None = None
    if key_file is not None:
        keys += read_key_file(key_file)
    elif not keys:
        if sqlite_file is None:
            raise KeyFileError(
                "PostgreSQL needs the keys that seal stored secrets: set PSYCH_SIDECAR_SECRET_KEYS "
                "(or secret_key_file) to a key made by `head -c 32 /dev/urandom | base64`"
            )
        beside = default_key_file(sqlite_file)
        if create_key_file(beside):
            created = beside
        keys = read_key_file(beside)
    return LoadedKeys(KeyRing(keys), created)

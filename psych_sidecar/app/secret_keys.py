"""The keys that seal stored secrets, loaded from the settings for serve, migrate and rekey,
and the start-up check that every stored secret opens with them."""

from __future__ import annotations

import logging
from pathlib import Path

from psych_sidecar.config import Settings
from psych_sidecar.listeners import StartupError
from psych_sidecar.secrets.cipher import KeyRing, SecretUnreadable
from psych_sidecar.secrets.key_files import KeyFileError, load_keys
from psych_sidecar.storage.connections import SqlConnectionStore
from psych_sidecar.storage.engines import normalize_url

log = logging.getLogger(__name__)


def load_secret_keys(settings: Settings) -> KeyRing:
    """The key ring: `secret_keys`, then `secret_key_file`'s keys, the first sealing; on the
    SQLite default with neither, the key file beside the database (made now if missing).
    A StartupError says what is wrong, in one line that never quotes a key."""
    url = normalize_url(settings.resolved_database_url())
    sqlite_file = Path(url.database or "") if url.get_backend_name() == "sqlite" else None
    storage = settings.storage
    try:
        loaded = load_keys(
            storage.secret_keys.get_secret_value(), storage.secret_key_file, sqlite_file
        )
    except KeyFileError as error:
        raise StartupError(str(error)) from None
    if loaded.created is not None:
        log.warning(
            "made the secret key file %s (mode 0600) for the secrets stored in %s: keep it, "
            "and back it up apart from the database (without it they cannot be read)",
            loaded.created,
            sqlite_file,
        )
    return loaded.ring


def check_stored_secrets(store: SqlConnectionStore) -> None:
    """Open every stored secret once, so that a missing or wrong key stops the start in one
    line (StartupError) rather than failing each server's first call; nothing is written."""
    try:
        store.check_secrets()
    except SecretUnreadable as error:
        raise StartupError(
            f"cannot read the stored secrets with the configured keys: {error} (see "
            "docs/operations.md, Keys)"
        ) from None

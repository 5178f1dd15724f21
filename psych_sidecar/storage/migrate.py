"""The schema: which revision this code knows, which one a database is at, and bringing it
there (alembic, imported only when there is a migration to apply)."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from psych_sidecar.secrets.cipher import KeyRing
from psych_sidecar.storage.engines import settle_freed_content

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# Any constant works; it only has to be the same in every sidecar sharing a database.
_MIGRATION_LOCK_KEY = 0x7073_6964_6563_6172  # "psidecar"
# The revision the newest migration makes (storage/migrations/versions; a test holds it to
# alembic's head). Known without alembic, so a start on a current schema never imports it.
SCHEMA_HEAD = "tool_input_rounds"


class DatabaseRefused(Exception):
    """A database a read-only reader will not use: no such SQLite file, or a schema this code
    does not know. The message says which, in one line."""


def _migration_scripts() -> ScriptDirectory:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", "psych_sidecar.storage:migrations")
    return ScriptDirectory.from_config(config)


def expected_revision() -> str:
    """The revision this code's migrations end at."""
    return SCHEMA_HEAD


def migrations_head() -> str | None:
    """The head of the migration scripts, as alembic reads them (what SCHEMA_HEAD must be)."""
    return _migration_scripts().get_current_head()


def schema_name(revision: str | None) -> str:
    """What an operator is shown for a schema revision: the name of the migration file that
    made it (the early revision ids predate the files' descriptive names and mean nothing to
    an operator); a revision this code does not know is shown as stored."""
    if revision is None:
        return "none"
    from alembic.util import CommandError

    try:
        script = _migration_scripts().get_revision(revision)
    except CommandError:  # no such revision
        script = None
    return Path(script.path).stem if script is not None else revision


def check_revision(engine: Engine) -> None:
    """Raise :class:`DatabaseRefused` unless the database's schema is at this code's revision
    (read from alembic_version; nothing is created or migrated)."""
    expected = expected_revision()
    found = current_revision(engine)
    if found != expected:
        where = engine.url.render_as_string(hide_password=True)
        if found is None:
            raise DatabaseRefused(
                f"{where} has no psych-sidecar schema (no alembic_version revision); "
                "run `psych-sidecar migrate` on it first"
            )
        raise DatabaseRefused(
            f"{where} is at schema {schema_name(found)!r}, "
            f"this psych-sidecar knows {schema_name(expected)!r}: "
            "use the psych-sidecar version that runs on it"
        )


def check_writable_values(engine: Engine) -> None:
    """Raise :class:`DatabaseRefused` when the sidecar could not store a large value: on
    PostgreSQL, values over 1 MiB are written through a temporary table (storage/bulk_values.py)
    and need the TEMPORARY privilege on the database (PostgreSQL grants it to every role unless
    it was revoked). Found at start, not by the first large tool result."""
    if engine.dialect.name != "postgresql":
        return
    with engine.connect() as connection:
        allowed = connection.execute(
            text("SELECT has_database_privilege(current_database(), 'TEMPORARY')")
        ).scalar_one()
    if not allowed:
        where = engine.url.render_as_string(hide_password=True)
        raise DatabaseRefused(
            f"the PostgreSQL role of {where} may not create temporary tables there (the "
            "TEMPORARY privilege), which storing values over 1 MiB needs: GRANT TEMPORARY ON "
            "DATABASE to it"
        )


def alembic_config(connection: Connection, keys: KeyRing | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", "psych_sidecar.storage:migrations")
    config.attributes["connection"] = connection
    # The migration that seals stored secrets needs them (when there is plaintext to seal).
    config.attributes["secret_keys"] = keys
    return config


def migrate(engine: Engine, keys: KeyRing | None = None) -> None:
    """Bring the schema to the newest migration. Safe to call from many sidecars at once:
    one runs the migrations while the others wait, then find nothing left to do (on
    PostgreSQL all of them in one transaction). `keys` seal
    secrets stored in plaintext by an older version (a database with none needs no keys).

    A schema already at SCHEMA_HEAD is read with one plain query, and alembic (a tenth of a
    start's imports) is imported only when there is a migration to apply."""
    if current_revision(engine) == SCHEMA_HEAD:
        return
    from alembic import command

    if engine.dialect.name == "postgresql":
        # One transaction, the lock a transaction's (released by its commit or rollback): it
        # holds nothing on the server session, so it works through PgBouncer in transaction
        # mode too, and PostgreSQL's DDL is transactional, so a failed migration leaves the
        # schema as it was.
        with engine.connect() as connection, connection.begin():
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
            )
            command.upgrade(alembic_config(connection, keys), "head")
        return
    database = engine.url.database
    assert database is not None
    with open(f"{database}.migrate-lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            with engine.connect() as connection:
                command.upgrade(alembic_config(connection, keys), "head")
                connection.commit()
            # A migration that rewrote secrets left the old pages in the write-ahead log.
            settle_freed_content(engine)
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def current_revision(engine: Engine) -> str | None:
    """The schema revision alembic recorded (its alembic_version table), or None for a
    database it never migrated."""
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        revisions = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    if len(revisions) > 1:
        raise DatabaseRefused(
            f"several schema revisions recorded: {sorted(r[0] for r in revisions)}"
        )
    return revisions[0][0] if revisions else None

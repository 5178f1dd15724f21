"""Secrets at rest: connection env and header values are sealed (AES-256-GCM) in the database,
under the operator's keys, and nothing readable is left in the database file."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, text

from psych_sidecar.domain.catalog import Connection, TransportKind
from psych_sidecar.secrets.cipher import KeyRing, SecretUnreadable, context, key_id
from psych_sidecar.secrets.key_files import KeyFileError, create_key_file, read_key_file
from psych_sidecar.storage.connections import SqlConnectionStore
from psych_sidecar.storage.db import alembic_config, create_database_engine, migrate
from tests.support.databases import POSTGRES_URL_ENV

ENV_SECRET = "planted-env-secret-5b1f0c"
HEADER_SECRET = "planted-header-secret-93d2aa"
# The revision before secrets were sealed: a database an older version left.
PLAINTEXT_REVISION = "0012"


def _key(byte: int) -> bytes:
    return bytes([byte]) * 32


def test_an_envelope_opens_only_under_its_key_and_where_it_was_sealed() -> None:
    old, new = _key(1), _key(2)
    where = context("connections", "tenant", "github", "headers")
    sealed = KeyRing([old]).seal('{"Authorization":"Bearer x"}', where)
    assert "Bearer" not in sealed
    assert KeyRing([new, old]).open(sealed, where) == '{"Authorization":"Bearer x"}'
    with pytest.raises(SecretUnreadable, match=key_id(old)) as missing:
        KeyRing([new]).open(sealed, where)
    assert "Bearer" not in str(missing.value)
    # Moved to another connection, or to the other field of the same one: refused.
    for elsewhere in (
        context("connections", "tenant", "gitlab", "headers"),
        context("connections", "tenant", "github", "env"),
        context("connections", "other", "github", "headers"),
    ):
        with pytest.raises(SecretUnreadable, match="fails authentication"):
            KeyRing([old]).open(sealed, elsewhere)
    # Two seals of one value differ (a fresh nonce each), and the first key of a ring seals.
    ring = KeyRing([new, old])
    assert ring.seal("v", where) != ring.seal("v", where)
    assert not ring.needs_resealing(ring.seal("v", where))
    assert ring.needs_resealing(sealed)
    with pytest.raises(SecretUnreadable, match="not sealed"):
        ring.open("{}", where)


def test_the_key_file_beside_a_database_is_private_and_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.db.keys"
    assert create_key_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_bytes()
    assert not create_key_file(path)
    assert path.read_bytes() == first
    assert len(read_key_file(path)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["sidecar.db.keys"]
    # A key that is not 32 bytes of base64 is refused without being quoted.
    short = base64.b64encode(b"tooshort-secret").decode()
    path.write_text(f"# comment\n\n{short}\n")
    with pytest.raises(KeyFileError, match="line 3") as refused:
        read_key_file(path)
    assert short not in str(refused.value)


def _plant_plaintext(engine: Engine) -> None:
    """A database as the version before sealing left it: two live connections with plaintext
    secrets and a deleted one."""
    with engine.connect() as connection:
        command.upgrade(alembic_config(connection), PLAINTEXT_REVISION)
        connection.commit()
    rows = [
        ("envy", "stdio", f'{{"FIXTURE_TOKEN":"{ENV_SECRET}"}}', "{}", None),
        ("heady", "streamable_http", "{}", f'{{"Authorization":"Bearer {HEADER_SECRET}"}}', None),
        ("gone", "streamable_http", "{}", "{}", 5),
    ]
    with engine.begin() as connection:
        for name, transport, env, headers, deleted in rows:
            connection.execute(
                text(
                    "INSERT INTO connections (tenant, name, revision, transport, command, args, "
                    "env, url, headers, preload, eager_tools, description, allow_tools, "
                    "deny_tools, catalog_version, create_time_us, update_time_us, "
                    "delete_time_us) VALUES ('t', :name, 1, :transport, '', '[]', :env, "
                    "'http://127.0.0.1:9/mcp', :headers, NULL, '[]', '', '[]', '[]', 0, 0, 0, "
                    ":deleted)"
                ),
                {
                    "name": name,
                    "transport": transport,
                    "env": env,
                    "headers": headers,
                    "deleted": deleted,
                },
            )


def raw_database_bytes(database_url: str) -> bytes:
    """Everything of the database on disk as an attacker holding the file would read it: the
    SQLite file and its write-ahead log, or PostgreSQL's pg_dump output."""
    if database_url.startswith("sqlite"):
        path = Path(database_url.removeprefix("sqlite:///"))
        files = [path, path.with_name(path.name + "-wal")]
        return b"".join(f.read_bytes() for f in files if f.exists())
    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
    return subprocess.run(["pg_dump", dsn], capture_output=True, check=True).stdout


def test_the_upgrade_seals_plaintext_secrets_and_leaves_none_readable(database_url: str) -> None:
    # A database of its own: the module's one is shared with other tests.
    if database_url.startswith("sqlite"):
        url = f"sqlite:///{Path(database_url.removeprefix('sqlite:///')).parent / 'upgrade.db'}"
        _upgrade_and_check(url)
    else:
        from tests.support.databases import postgres_database

        assert os.environ.get(POSTGRES_URL_ENV)
        with postgres_database() as url:
            _upgrade_and_check(url)


def _upgrade_and_check(url: str) -> None:
    engine = create_database_engine(url, pool_size=1)
    keys = KeyRing([_key(7)])
    try:
        _plant_plaintext(engine)
        assert ENV_SECRET.encode() in raw_database_bytes(url)  # the positive control
        # Without keys, the upgrade refuses (nothing is changed) rather than leave plaintext.
        with pytest.raises(RuntimeError, match="secret keys"):
            migrate(engine)
        assert ENV_SECRET.encode() in raw_database_bytes(url)
        migrate(engine, keys)
        raw = raw_database_bytes(url)
        for secret in (ENV_SECRET, HEADER_SECRET, "FIXTURE_TOKEN", "Authorization"):
            assert secret.encode() not in raw
        store = SqlConnectionStore(engine, keys)
        stored = {s.connection.name: s.connection for s in store.all_connections()}
        assert stored["envy"].env == {"FIXTURE_TOKEN": ENV_SECRET}
        assert stored["heady"].headers == {"Authorization": f"Bearer {HEADER_SECRET}"}
        assert set(stored) == {"envy", "heady"}
        assert store.check_secrets() == 4
        with pytest.raises(SecretUnreadable, match=key_id(_key(7))):
            SqlConnectionStore(engine, KeyRing([_key(8)])).check_secrets()
    finally:
        engine.dispose()


def test_rekey_reseals_under_the_first_key_and_the_old_one_can_go(database_url: str) -> None:
    old, new = KeyRing([_key(1)]), KeyRing([_key(2), _key(1)])
    engine = create_database_engine(database_url, pool_size=2)
    tenant = "rekey-" + os.urandom(4).hex()
    try:
        migrate(engine, old)
        before = SqlConnectionStore(engine, old)
        for index in range(3):
            before.put_connection(
                Connection(
                    tenant=tenant,
                    name=f"c{index}",
                    transport=TransportKind.STREAMABLE_HTTP,
                    url="http://127.0.0.1:9/mcp",
                    headers={"X-Key": f"{HEADER_SECRET}-{index}"},
                )
            )
        revisions = {
            s.connection.name: s.revision
            for s in before.all_connections()
            if s.connection.tenant == tenant
        }
        store = SqlConnectionStore(engine, new)
        resealed, already = store.reseal_secrets()
        assert (resealed, already) == (6, 0)
        assert store.reseal_secrets() == (0, resealed)  # again: nothing left to do
        only_new = SqlConnectionStore(engine, KeyRing([_key(2)]))
        only_new.check_secrets()
        mine = [s for s in only_new.all_connections() if s.connection.tenant == tenant]
        assert [s.connection.headers["X-Key"] for s in mine] == [
            f"{HEADER_SECRET}-{index}" for index in range(3)
        ]
        # The secrets did not change, so neither did the revisions (no session reconnects).
        assert {s.connection.name: s.revision for s in mine} == revisions
        with pytest.raises(SecretUnreadable):
            SqlConnectionStore(engine, KeyRing([_key(1)])).check_secrets()
    finally:
        engine.dispose()

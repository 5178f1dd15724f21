"""Secrets at rest: connection env and header values are sealed (AES-256-GCM) in the database,
under the operator's keys, and nothing readable is left in the database file."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from alembic import command
from sqlalchemy import Engine, text

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from psych_sidecar.domain.catalog import Connection, TransportKind
from psych_sidecar.domain.catalog.oauth import OAuthGrant, PendingSignIn
from psych_sidecar.secrets.cipher import KeyRing, SecretUnreadable, context, key_id
from psych_sidecar.secrets.key_files import KeyFileError, create_key_file, read_key_file
from psych_sidecar.storage.connections import SqlConnectionStore
from psych_sidecar.storage.engines import create_database_engine
from psych_sidecar.storage.migrate import alembic_config, migrate
from psych_sidecar.storage.oauth import SqlOAuthStore
from tests.support.connections import fixture_commands, fixture_http, listed, put_http, put_stdio
from tests.support.databases import POSTGRES_URL_ENV, postgres_database, raw_database_bytes
from tests.support.host import Host, result_text
from tests.support.oauth_sign_in import (
    begin,
    browse,
    complete,
    issued_secrets,
    oauth_server,
    put_oauth,
    sign_in,
    stats,
    url_of,
)
from tests.support.polling import wait_for
from tests.support.processes import COMMAND, ServedSidecar, free_port, running, served
from tests.support.sidecar import Stubs

ENV_SECRET = "planted-env-secret-5b1f0c"
HEADER_SECRET = "planted-header-secret-93d2aa"
TOKEN_SECRET = "planted-oauth-token-7c41e2"
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


def test_the_upgrade_seals_plaintext_secrets_and_leaves_none_readable(database_url: str) -> None:
    # A database of its own: the module's one is shared with other tests.
    if database_url.startswith("sqlite"):
        url = f"sqlite:///{Path(database_url.removeprefix('sqlite:///')).parent / 'upgrade.db'}"
        _upgrade_and_check(url)
    else:
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
        # The upgrade as an operator runs it.
        upgrade = subprocess.run(
            [*COMMAND, "migrate", "--database-url", url],
            env={**_clean_environment(), KEYS_ENV: base64.b64encode(_key(7)).decode()},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert upgrade.returncode == 0, upgrade.stderr
        assert "applied schema migration 0008_sealed_connection_secrets" in upgrade.stderr
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
        # An OAuth grant (tokens, client) and a begun sign-in (its verifier) are resealed too.
        grants = SqlOAuthStore(engine, old)
        grants.put_grant(
            tenant,
            "c0",
            OAuthGrant(1, f'{{"access_token":"{TOKEN_SECRET}"}}', "{}", "{}", None),
        )
        grants.save_sign_in(
            PendingSignIn(
                state_digest=os.urandom(32).hex(),
                tenant=tenant,
                name="c0",
                revision=1,
                expire_time=datetime.now(UTC) + timedelta(minutes=5),
                verifier=TOKEN_SECRET,
                client_json="{}",
                metadata_json="{}",
                scope="",
                resource="",
            )
        )
        store = SqlConnectionStore(engine, new)
        resealed, already = store.reseal_secrets()
        assert (resealed, already) == (6 + 3, 0)
        assert store.reseal_secrets() == (0, resealed)  # again: nothing left to do
        only_new = SqlConnectionStore(engine, KeyRing([_key(2)]))
        only_new.check_secrets()
        token = SqlOAuthStore(engine, KeyRing([_key(2)])).get_grant(tenant, "c0")
        assert token is not None
        assert TOKEN_SECRET in token.tokens_json
        assert TOKEN_SECRET.encode() not in raw_database_bytes(database_url)
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


# Through the CLI and gRPC: `psych-sidecar serve` and `rekey` as an operator runs them ----------

SMALL = ("--tools", "3")
KEYS_ENV = "PSYCH_SIDECAR_SECRET_KEYS"


def _clean_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PSYCH_SIDECAR_")}


def _new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def _serve_flags(tmp_path: Path, *more: str) -> list[str]:
    return ["--listen", f"unix://{tmp_path / 's.sock'}", "--data-dir", str(tmp_path), *more]


def _serve_env(keys: str | None) -> dict[str, str | None]:
    return {KEYS_ENV: keys, "PSYCH_SIDECAR_MCP_COMMANDS": json.dumps(fixture_commands())}


def _uses_its_secrets(stubs: Stubs, tenant: str, header_port: int) -> None:
    """The stdio server gets the decrypted env, the HTTP server (which answers 401 without
    it) the decrypted header: what the sidecar stored, it can use."""
    host = Host(stubs, tenant)
    run_id = host.run("uses-secrets-" + os.urandom(3).hex())
    outcome = host.call(run_id, "envy", "getenv", name="FIXTURE_TOKEN")
    assert result_text(outcome) == ENV_SECRET
    with running(fixture_http(header_port, *SMALL, "--require-header", f"X-Key={HEADER_SECRET}")):
        wait_for(
            lambda: (
                listed(stubs, tenant)["heady"].state == connection_pb2.CONNECTION_STATE_CONNECTED
            ),
            "the HTTP connection to use its header",
        )
        assert result_text(host.call(run_id, "heady", "echo", text="hi")) == "hi"


def _one_line_failure(sidecar: ServedSidecar) -> str:
    status = sidecar.exit_status()
    assert status == 1, sidecar.log
    assert "Traceback" not in sidecar.log, sidecar.log
    line = sidecar.log.strip().splitlines()[-1]
    assert line.startswith("psych-sidecar: "), sidecar.log
    return line


def test_zero_step_key_rotation_rekey_and_a_wrong_key_through_the_cli(tmp_path: Path) -> None:
    tenant, port = "t-" + os.urandom(3).hex(), free_port()
    flags = _serve_flags(tmp_path)
    key_file = tmp_path / "sidecar.db.keys"
    # No key configured on SQLite: the sidecar makes its key file beside the database.
    with (
        served(*flags, env=_serve_env(None)) as sidecar,
        grpc.insecure_channel(f"unix:{tmp_path / 's.sock'}") as channel,
    ):
        assert "made the secret key file" in sidecar.log
        stubs = Stubs.on(channel)
        stdio = put_stdio(stubs, tenant, "envy", args=SMALL, env={"FIXTURE_TOKEN": ENV_SECRET})
        http = put_http(
            stubs, tenant, "heady", f"http://127.0.0.1:{port}/mcp", {"X-Key": HEADER_SECRET}
        )
        got = stubs.connections.ListConnections(
            connection_service_pb2.ListConnectionsRequest(tenant=tenant)
        )
        for reply in (stdio, http, got):
            assert ENV_SECRET.encode() not in reply.SerializeToString()
            assert HEADER_SECRET.encode() not in reply.SerializeToString()
        raw = raw_database_bytes(f"sqlite:///{tmp_path / 'sidecar.db'}")
        assert b"heady" in raw  # the positive control: the rows are there
        assert ENV_SECRET.encode() not in raw
        assert HEADER_SECRET.encode() not in raw
        # (After this, the Run log holds getenv's result, the secret, as any tool result.)
        _uses_its_secrets(stubs, tenant, port)
        log = sidecar.log
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert ENV_SECRET not in log
    assert HEADER_SECRET not in log
    first_key = read_key_file(key_file)[0]
    database_before = (tmp_path / "sidecar.db").read_bytes()

    # A wrong key: one line naming the key the secrets need, exit 1, nothing changed.
    wrong_key = _new_key()
    wrong = ServedSidecar(*flags, env=_serve_env(wrong_key))
    line = _one_line_failure(wrong)
    assert key_id(first_key) in line
    for secret in (ENV_SECRET, HEADER_SECRET, wrong_key, base64.b64encode(first_key).decode()):
        assert secret not in wrong.log
    assert read_key_file(key_file) == [first_key]
    assert (tmp_path / "sidecar.db").read_bytes() == database_before

    # Rotation: a new key first, the old one still read; rekey while the sidecar serves.
    new_key = _new_key()
    key_file.write_text(f"{new_key}\n{base64.b64encode(first_key).decode()}\n")
    with (
        served(*flags, env=_serve_env(None)),
        grpc.insecure_channel(f"unix:{tmp_path / 's.sock'}") as channel,
    ):
        rekey = subprocess.run(
            [*COMMAND, "rekey", "--data-dir", str(tmp_path)],
            env=_clean_environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert rekey.stdout.startswith(
            f"4 stored secrets resealed under key {key_id(base64.b64decode(new_key))}"
        ), rekey.stdout
        for shown in (rekey.stdout, rekey.stderr):
            for secret in (
                ENV_SECRET,
                HEADER_SECRET,
                new_key,
                base64.b64encode(first_key).decode(),
            ):
                assert secret not in shown
        _uses_its_secrets(Stubs.on(channel), tenant, port)
    # The old key removed: everything still opens.
    key_file.write_text(new_key + "\n")
    with (
        served(*flags, env=_serve_env(None)),
        grpc.insecure_channel(f"unix:{tmp_path / 's.sock'}") as channel,
    ):
        _uses_its_secrets(Stubs.on(channel), tenant, port)


def test_postgresql_without_a_key_is_refused_and_pg_dump_shows_no_secret(tmp_path: Path) -> None:
    with postgres_database() as url:
        refused = ServedSidecar(
            *_serve_flags(tmp_path, "--database-url", url), env=_serve_env(None)
        )
        line = _one_line_failure(refused)
        assert KEYS_ENV in line
        tenant, key = "t-" + os.urandom(3).hex(), _new_key()
        flags = _serve_flags(tmp_path, "--database-url", url)
        with (
            served(*flags, env=_serve_env(key)),
            grpc.insecure_channel(f"unix:{tmp_path / 's.sock'}") as channel,
        ):
            stubs = Stubs.on(channel)
            put_stdio(stubs, tenant, "envy", args=SMALL, env={"FIXTURE_TOKEN": ENV_SECRET})
            put_http(stubs, tenant, "heady", "http://127.0.0.1:9/mcp", {"X-Key": HEADER_SECRET})
            dump = raw_database_bytes(url)
            assert b"heady" in dump
            assert ENV_SECRET.encode() not in dump
            assert HEADER_SECRET.encode() not in dump


def _sealed_rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the tables that hold sealed secrets, in a stable order."""
    engine = create_database_engine(url, pool_size=1)
    try:
        with engine.connect() as connection:
            return {
                table: [
                    tuple(row)
                    for row in connection.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2"))
                ]
                for table in ("connections", "oauth_grants", "oauth_sign_ins")
            }
    finally:
        engine.dispose()


def test_a_wrong_key_with_oauth_tokens_stored_changes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    # A database of its own: the module's one holds rows sealed under other keys.
    if database_url.startswith("sqlite"):
        _wrong_key_with_oauth_tokens(f"sqlite:///{tmp_path / 'sidecar.db'}", tmp_path)
    else:
        with postgres_database() as url:
            _wrong_key_with_oauth_tokens(url, tmp_path)


def _wrong_key_with_oauth_tokens(url: str, tmp_path: Path) -> None:
    tenant, key = "t-" + os.urandom(3).hex(), _new_key()
    flags = _serve_flags(tmp_path, "--database-url", url)
    env = {
        **_serve_env(key),
        "PSYCH_SIDECAR_OAUTH_ALLOW_HTTP_LOOPBACK": "true",
        "PSYCH_SIDECAR_MCP_RECONNECT_MIN_SECONDS": "0.2",
        "PSYCH_SIDECAR_MCP_RECONNECT_MAX_SECONDS": "1",
    }
    # Tokens that outlive the test: the stored access token itself must serve after restart.
    with running(oauth_server(free_port(), "--token-seconds", "3600")) as server:
        with (
            served(*flags, env=env),
            grpc.insecure_channel(f"unix:{tmp_path / 's.sock'}") as channel,
        ):
            stubs = Stubs.on(channel)
            put_oauth(stubs, tenant, "tracker", url_of(server))
            sign_in(stubs, tenant, "tracker")
            pending = begin(stubs, tenant, "tracker")  # a begun sign-in stored too
        before = _sealed_rows(url)
        assert before["oauth_grants"]  # the positive controls
        assert before["oauth_sign_ins"]

        wrong_key = _new_key()
        wrong = ServedSidecar(*flags, env={**env, KEYS_ENV: wrong_key})
        line = _one_line_failure(wrong)
        assert key_id(base64.b64decode(key)) in line
        for secret in (*issued_secrets(server), pending.state, key, wrong_key):
            assert secret not in wrong.log
        assert _sealed_rows(url) == before

        refreshes = stats(server)["refreshes"]
        with (
            served(*flags, env=env),
            grpc.insecure_channel(f"unix:{tmp_path / 's.sock'}") as channel,
        ):
            stubs = Stubs.on(channel)
            host = Host(stubs, tenant)
            outcome = host.call(host.run("after-" + tenant), "tracker", "echo", text="kept")
            assert result_text(outcome) == "kept"
            assert stats(server)["refreshes"] == refreshes  # the stored token served
            # The begun sign-in's verifier opens too: it completes.
            code, state = browse(pending.authorization_url)
            assert complete(stubs, tenant, code, state).state == (
                connection_pb2.CONNECTION_STATE_CONNECTED
            )

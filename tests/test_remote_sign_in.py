"""Remote MCP servers that need OAuth: a host signs its user in with BeginSignIn and
CompleteSignIn, the sidecar keeps the tokens fresh, and a server that stops accepting them is
AUTHORIZATION_REQUIRED. Against a real OAuth-protected streamable-HTTP server on loopback
(tests/mcp_servers/oauth_server.py), the test playing the user's browser."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from psych_sidecar.config import Settings
from psych_sidecar.storage import tables
from tests.support.connections import listed
from tests.support.databases import TEST_SECRET_KEY
from tests.support.host import Host, result_text
from tests.support.oauth_sign_in import (
    REDIRECT_URI,
    admin_post,
    begin,
    browse,
    complete,
    issued_secrets,
    oauth_server,
    put_oauth,
    sign_in,
    stats,
    token_auth,
    url_of,
)
from tests.support.polling import wait_for
from tests.support.processes import HttpServer, free_port, running
from tests.support.prompts import assemble
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def sidecar_settings(tmp_path: Path, **overrides: Any) -> Settings:
    return flat_settings(
        listen=[f"unix://{tmp_path / 's.sock'}"],
        database_url=f"sqlite:///{tmp_path / 'sidecar.db'}",
        data_dir=tmp_path,
        shutdown_grace_seconds=5,
        secret_keys=TEST_SECRET_KEY,
        oauth_allow_http_loopback=True,
        mcp_reconnect_min_seconds=0.2,
        mcp_reconnect_max_seconds=1.0,
        **overrides,
    )


@pytest.fixture(scope="module")
def server() -> Iterator[HttpServer]:
    with running(oauth_server(free_port())) as started:
        yield started


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sign-in")


@pytest.fixture(scope="module")
def database_file(directory: Path) -> Path:
    return directory / "sidecar.db"


@pytest.fixture(scope="module")
def sidecar(directory: Path) -> Iterator[RunningSidecar]:
    with RunningSidecar(sidecar_settings(directory, admin_listen=["127.0.0.1:0"])) as running:
        yield running


@pytest.fixture(scope="module")
def stubs(sidecar: RunningSidecar) -> Iterator[Stubs]:
    with sidecar.stubs() as stubs:
        yield stubs


@pytest.fixture
def tenant(stubs: Stubs) -> Iterator[str]:
    name = f"tenant-{time.monotonic_ns()}"
    yield name
    for connection in listed(stubs, name):
        stubs.connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant=name, name=connection)
        )


def test_sign_in_end_to_end_then_a_deferred_call(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    put = put_oauth(stubs, tenant, "tracker", url_of(server))
    assert put.state == connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED
    assert (
        put.authorization_required_reason
        == connection_pb2.AUTHORIZATION_REQUIRED_REASON_NEVER_SIGNED_IN
    )
    assert put.http.HasField("oauth_authorization_code")

    started = begin(stubs, tenant, "tracker")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(started.authorization_url).query)
    assert query["code_challenge_method"] == ["S256"]
    assert query["state"] == [started.state]
    assert query["resource"] == [url_of(server)]
    code, state = browse(started.authorization_url)

    connection = complete(stubs, tenant, code, state, "tracker")
    assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED, connection.last_error
    assert connection.HasField("token_expire_time")
    assert connection.catalog_version >= 1

    host = Host(stubs, tenant)
    run_id = host.run(f"spec-{tenant}")
    outcome = host.call(run_id, "tracker", "echo", text="hello")
    assert not outcome.is_error, result_text(outcome)
    assert result_text(outcome) == "hello"


def test_the_inspector_shows_auth_state_and_token_expiry_never_a_token(
    stubs: Stubs, server: HttpServer, tenant: str, sidecar: RunningSidecar
) -> None:
    put_oauth(stubs, tenant, "tracker", url_of(server))
    assert sidecar.sidecar.admin is not None
    [base_url] = sidecar.sidecar.admin.bound
    page = httpx.get(f"{base_url}/ui/connections?tenant={tenant}", timeout=10).text
    assert "oauth_authorization_code" in page
    assert "authorizing again: never_signed_in" in page
    sign_in(stubs, tenant, "tracker")
    page = httpx.get(f"{base_url}/ui/connections?tenant={tenant}", timeout=10).text
    assert "Token expires" in page
    for secret in issued_secrets(server):
        assert secret not in page


def test_tokens_and_client_secrets_are_not_readable_in_the_database_file(
    stubs: Stubs, server: HttpServer, tenant: str, database_file: Path
) -> None:
    put_oauth(stubs, tenant, "tracker", url_of(server))
    sign_in(stubs, tenant, "tracker")
    started = begin(stubs, tenant, "tracker")  # a pending sign-in's verifier stored too
    planted = issued_secrets(server)
    assert planted
    raw = b"".join(
        path.read_bytes()
        for path in (database_file, database_file.with_name(database_file.name + "-wal"))
        if path.exists()
    )
    assert started.state.encode() not in raw
    for secret in planted:
        assert secret.encode() not in raw


def test_a_hundred_calls_across_several_token_expiries_all_succeed(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    put_oauth(stubs, tenant, "tracker", url_of(server))
    sign_in(stubs, tenant, "tracker")
    host = Host(stubs, tenant)
    run_id = host.run(f"spec-{tenant}")
    before = stats(server)["refreshes"]
    failures = []
    deadline = time.monotonic() + 14  # tokens live 4 s: at least three expiries
    calls = 0
    while calls < 100 or time.monotonic() < deadline:
        outcome = host.call(run_id, "tracker", "echo", text=f"call {calls}")
        if outcome.is_error or result_text(outcome) != f"call {calls}":
            failures.append(result_text(outcome))
        calls += 1
        time.sleep(0.1)
    assert failures == []
    assert stats(server)["refreshes"] - before >= 3


def test_refresh_catalog_before_sign_in_is_a_typed_error(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    put_oauth(stubs, tenant, "tracker", url_of(server))
    failure = rpc_failure(
        lambda: stubs.connections.RefreshCatalog(
            connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="tracker")
        )
    )
    assert (failure.code, failure.info.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "CONNECTION_AUTHORIZATION_REQUIRED",
    )
    assert failure.info.metadata["reason"] == "NEVER_SIGNED_IN"


def test_a_revoked_refresh_needs_the_user_again_and_a_new_sign_in_restores_it(
    stubs: Stubs, server: HttpServer, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    put_oauth(stubs, tenant, "tracker", url_of(server))
    sign_in(stubs, tenant, "tracker")
    host = Host(stubs, tenant)
    run_id = host.run(f"spec-{tenant}")
    httpx.post(f"http://127.0.0.1:{server.port}/admin/revoke?access=1", timeout=10)

    outcome = host.call(run_id, "tracker", "echo", text="after revoke")
    assert outcome.is_error
    assert "sign in again" in result_text(outcome)

    def required() -> connection_pb2.Connection | None:
        connection = listed(stubs, tenant)["tracker"]
        return (
            connection
            if connection.state == connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED
            else None
        )

    connection = wait_for(required, "the connection needs authorizing")
    assert (
        connection.authorization_required_reason
        == connection_pb2.AUTHORIZATION_REQUIRED_REASON_REFRESH_REFUSED
    )
    assert "sign in again" in connection.last_error
    assert len(connection.last_error) <= 200

    host.new_turn(run_id)
    prompt = assemble(stubs, run_id).prompt
    transient = "".join(part.content.text for part in prompt.transient.parts)
    assert "tracker needs the user to sign in: its calls fail until they do." in transient

    signed_in = sign_in(stubs, tenant, "tracker")
    assert signed_in.state == connection_pb2.CONNECTION_STATE_CONNECTED
    outcome = host.call(run_id, "tracker", "echo", text="back")
    assert not outcome.is_error, result_text(outcome)
    assert "needs authorizing: refresh_refused" in caplog.text  # the log was captured
    for secret in issued_secrets(server):
        assert secret not in caplog.text


def test_a_fresh_token_the_server_refuses_waits_for_a_new_sign_in(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    put_oauth(stubs, tenant, "tracker", url_of(server))
    sign_in(stubs, tenant, "tracker")
    host = Host(stubs, tenant)
    run_id = host.run(f"spec-{tenant}")
    admin = f"http://127.0.0.1:{server.port}/admin/refuse-access"
    httpx.post(f"{admin}?on=1", timeout=10)
    try:
        refreshes = stats(server)["refreshes"]
        outcome = host.call(run_id, "tracker", "echo", text="refused")
        assert outcome.is_error
        assert "sign in again" in result_text(outcome)
        # Renewed once (the 401), sent once more, refused again: the user must sign in.
        assert stats(server)["refreshes"] == refreshes + 1
    finally:
        httpx.post(f"{admin}?on=0", timeout=10)
    # Stored with the grant: the session waits for a sign-in, it does not reconnect with the
    # same tokens (which the server would accept again now), not even in an attempt made at
    # once, as a refresh on demand makes one.
    failure = rpc_failure(
        lambda: stubs.connections.RefreshCatalog(
            connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="tracker")
        )
    )
    assert (failure.info.reason, failure.info.metadata["reason"]) == (
        "CONNECTION_AUTHORIZATION_REQUIRED",
        "REFRESH_REFUSED",
    )
    connection = listed(stubs, tenant)["tracker"]
    assert connection.state == connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED
    assert (
        connection.authorization_required_reason
        == connection_pb2.AUTHORIZATION_REQUIRED_REASON_REFRESH_REFUSED
    )
    assert sign_in(stubs, tenant, "tracker").state == connection_pb2.CONNECTION_STATE_CONNECTED


@pytest.mark.parametrize("case", ["reused", "other-tenant", "other-connection", "unknown"])
def test_a_state_that_cannot_complete_is_a_typed_error(
    stubs: Stubs, server: HttpServer, tenant: str, case: str
) -> None:
    put_oauth(stubs, tenant, "tracker", url_of(server))
    started = begin(stubs, tenant, "tracker")
    code, state = browse(started.authorization_url)
    expected: tuple[grpc.StatusCode, str]
    if case == "reused":
        complete(stubs, tenant, code, state)
        call = lambda: complete(stubs, tenant, code, state)  # noqa: E731
        expected = (grpc.StatusCode.FAILED_PRECONDITION, "SIGN_IN_STATE_USED")
    elif case == "other-tenant":
        call = lambda: complete(stubs, f"{tenant}-other", code, state)  # noqa: E731
        expected = (grpc.StatusCode.PERMISSION_DENIED, "SIGN_IN_STATE_WRONG_TENANT")
    elif case == "other-connection":
        call = lambda: complete(stubs, tenant, code, state, "another")  # noqa: E731
        expected = (grpc.StatusCode.FAILED_PRECONDITION, "SIGN_IN_STATE_MISMATCH")
    else:
        call = lambda: complete(stubs, tenant, code, state + "x")  # noqa: E731
        expected = (grpc.StatusCode.NOT_FOUND, "SIGN_IN_STATE_UNKNOWN")
    failure = rpc_failure(call)
    assert (failure.code, failure.info.reason) == expected
    assert code not in failure.message
    if case != "reused":
        # Refused without spending it: the right request still completes.
        connection = complete(stubs, tenant, code, state)
        assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED


def test_an_expired_state_is_a_typed_error(server: HttpServer, tmp_path: Path) -> None:
    settings = sidecar_settings(tmp_path, oauth_sign_in_state_seconds=600)
    with (
        RunningSidecar(settings) as sidecar,
        sidecar.stubs() as stubs,
    ):
        put_oauth(stubs, "t", "tracker", url_of(server))
        started = begin(stubs, "t", "tracker")
        code, state = browse(started.authorization_url)
        # The stored deadline decides: it is the one the host was told, and once it has
        # passed (moved into the past here rather than waited for) the state is spent.
        sign_ins = tables.oauth_sign_ins
        with sidecar.stored() as connection:
            stored = connection.execute(
                sa.select(sign_ins.c.expire_time_us).where(sign_ins.c.tenant == "t")
            ).scalar_one()
            assert stored == started.expire_time.ToMicroseconds()
            told = started.expire_time.ToDatetime(tzinfo=UTC)
            assert told - datetime.now(UTC) > timedelta(seconds=590)
            connection.execute(
                sa.update(sign_ins)
                .where(sign_ins.c.tenant == "t")
                .values(expire_time_us=int(time.time() * 1_000_000) - 1)
            )
        failure = rpc_failure(lambda: complete(stubs, "t", code, state))
        assert failure.code == grpc.StatusCode.FAILED_PRECONDITION
        assert failure.info.reason == "SIGN_IN_STATE_EXPIRED"
        stubs.connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant="t", name="tracker")
        )


@pytest.mark.parametrize(
    ("flags", "code", "reason"),
    [
        (
            ("--issuer", "http://169.254.169.254"),
            grpc.StatusCode.PERMISSION_DENIED,
            "OAUTH_URL_REFUSED",
        ),
        (("--issuer", "https://10.1.2.3"), grpc.StatusCode.PERMISSION_DENIED, "OAUTH_URL_REFUSED"),
        (("--metadata-padding", "3000000"), grpc.StatusCode.UNAVAILABLE, "OAUTH_DISCOVERY_FAILED"),
        (("--metadata-delay", "30"), grpc.StatusCode.UNAVAILABLE, "OAUTH_DISCOVERY_FAILED"),
    ],
)
def test_untrusted_metadata_is_refused_with_a_typed_error(
    tmp_path: Path, flags: tuple[str, ...], code: grpc.StatusCode, reason: str
) -> None:
    settings = sidecar_settings(tmp_path, oauth_request_timeout_seconds=2)
    with (
        running(oauth_server(free_port(), *flags)) as hostile,
        RunningSidecar(settings) as sidecar,
        sidecar.stubs() as stubs,
    ):
        put_oauth(stubs, "t", "hostile", url_of(hostile))
        failure = rpc_failure(lambda: begin(stubs, "t", "hostile"))
        assert (failure.code, failure.info.reason) == (code, reason)
        assert stats(hostile)["registrations"] == 0
        stubs.connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant="t", name="hostile")
        )


def test_authorization_server_metadata_of_another_issuer_is_refused_as_not_retryable(
    tmp_path: Path,
) -> None:
    """The protected-resource metadata names the authorization server as localhost, whose
    metadata says its issuer is 127.0.0.1 (RFC 8414 §3.3): refused for what it says, a
    FAILED_PRECONDITION a host does not retry, not an outage's UNAVAILABLE."""
    port = free_port()
    with (
        running(oauth_server(port, "--issuer", f"http://localhost:{port}")) as misissued,
        RunningSidecar(sidecar_settings(tmp_path)) as sidecar,
        sidecar.stubs() as stubs,
    ):
        put_oauth(stubs, "t", "misissued", url_of(misissued))
        failure = rpc_failure(lambda: begin(stubs, "t", "misissued"))
        assert (failure.code, failure.info.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "OAUTH_METADATA_REFUSED",
        ), failure
        assert stats(misissued)["registrations"] == 0


def test_begin_sign_in_on_a_connection_without_oauth_is_a_typed_error(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    http = connection_pb2.HttpTransport(
        url=url_of(server), protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP
    )
    connection = connection_pb2.Connection(tenant=tenant, name="plain", http=http)
    stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    )
    failure = rpc_failure(lambda: begin(stubs, tenant, "plain"))
    assert (failure.code, failure.info.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "SIGN_IN_NOT_APPLICABLE",
    )


def test_client_credentials_connect_and_call(stubs: Stubs, server: HttpServer, tenant: str) -> None:
    httpx.post(
        f"http://127.0.0.1:{server.port}/admin/clients",
        json={"client_id": "machine", "client_secret": "machine-secret-value"},
        timeout=10,
    )
    http = connection_pb2.HttpTransport(
        url=url_of(server),
        protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
        oauth_client_credentials=connection_pb2.OAuthClientCredentials(
            client_id="machine", client_secret="machine-secret-value", scopes=["mcp"]
        ),
    )
    connection = connection_pb2.Connection(tenant=tenant, name="machine", http=http)
    put = stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    ).connection
    assert put.state == connection_pb2.CONNECTION_STATE_CONNECTED, put.last_error
    assert not put.http.oauth_client_credentials.client_secret
    host = Host(stubs, tenant)
    run_id = host.run(f"spec-{tenant}")
    outcome = host.call(run_id, "machine", "echo", text="m2m")
    assert result_text(outcome) == "m2m"


def test_refused_client_credentials_need_authorizing(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    http = connection_pb2.HttpTransport(
        url=url_of(server),
        protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
        oauth_client_credentials=connection_pb2.OAuthClientCredentials(
            client_id="nobody", client_secret="wrong-secret-value"
        ),
    )
    connection = connection_pb2.Connection(tenant=tenant, name="machine", http=http)
    put = stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    ).connection
    assert put.state == connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED
    assert (
        put.authorization_required_reason
        == connection_pb2.AUTHORIZATION_REQUIRED_REASON_CREDENTIALS_REFUSED
    )


def create_client(server: HttpServer, **client: str) -> None:
    httpx.post(f"http://127.0.0.1:{server.port}/admin/clients", json=client, timeout=10)


@pytest.mark.parametrize(
    "named", ["https://elsewhere.example/mcp", "http://127.0.0.1:{port}/another"]
)
def test_metadata_for_another_resource_is_refused_before_any_authorization_url(
    tmp_path: Path, named: str
) -> None:
    port = free_port()
    with (
        running(oauth_server(port, "--resource", named.format(port=port))) as misnamed,
        RunningSidecar(sidecar_settings(tmp_path)) as sidecar,
        sidecar.stubs() as stubs,
    ):
        put_oauth(stubs, "t", "misnamed", url_of(misnamed))
        failure = rpc_failure(lambda: begin(stubs, "t", "misnamed"))
        # Not retryable: the same metadata gets the same answer.
        assert (failure.code, failure.info.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "OAUTH_METADATA_REFUSED",
        )
        assert "protected-resource metadata is for" in failure.message
        # Refused before the client was registered or a sign-in was stored.
        assert stats(misnamed)["registrations"] == 0
        connection = listed(stubs, "t")["misnamed"]
        assert (
            connection.authorization_required_reason
            == connection_pb2.AUTHORIZATION_REQUIRED_REASON_NEVER_SIGNED_IN
        )
        stubs.connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant="t", name="misnamed")
        )


def test_metadata_for_a_resource_the_server_is_part_of_is_followed(tmp_path: Path) -> None:
    """The control of the refusal above: the origin names a resource covering /mcp."""
    port = free_port()
    with (
        running(oauth_server(port, "--resource", f"http://127.0.0.1:{port}/")) as covering,
        RunningSidecar(sidecar_settings(tmp_path)) as sidecar,
        sidecar.stubs() as stubs,
    ):
        put_oauth(stubs, "t", "covering", url_of(covering))
        started = begin(stubs, "t", "covering")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(started.authorization_url).query)
        assert query["resource"] == [f"http://127.0.0.1:{port}/"]
        assert stats(covering)["registrations"] == 1
        stubs.connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant="t", name="covering")
        )


def test_a_pre_registered_client_signs_in_with_http_basic(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    client_id = f"registered-{tenant}"
    create_client(
        server,
        client_id=client_id,
        client_secret="registered-secret-value",
        redirect_uri=REDIRECT_URI,
    )
    http = connection_pb2.HttpTransport(
        url=url_of(server),
        protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
        oauth_authorization_code=connection_pb2.OAuthAuthorizationCode(
            registered_client=connection_pb2.OAuthRegisteredClient(
                client_id=client_id, client_secret="registered-secret-value"
            ),
            redirect_uri=REDIRECT_URI,
        ),
    )
    connection = connection_pb2.Connection(tenant=tenant, name="registered", http=http)
    put = stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    ).connection
    assert not put.http.oauth_authorization_code.registered_client.client_secret
    registrations, before = stats(server)["registrations"], token_auth(server, client_id)

    started = begin(stubs, tenant, "registered")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(started.authorization_url).query)
    assert query["client_id"] == [client_id]
    code, state = browse(started.authorization_url)
    signed_in = complete(stubs, tenant, code, state, "registered")
    assert signed_in.state == connection_pb2.CONNECTION_STATE_CONNECTED, signed_in.last_error

    after = token_auth(server, client_id)
    assert after["client_secret_basic"] > before["client_secret_basic"]
    for method in ("client_secret_post", "private_key_jwt", "none"):
        assert after[method] == before[method], method
    assert stats(server)["registrations"] == registrations
    host = Host(stubs, tenant)
    outcome = host.call(host.run(f"spec-{tenant}"), "registered", "echo", text="basic")
    assert result_text(outcome) == "basic"


def _key_pair() -> tuple[str, str]:
    """(private key PEM, public key PEM) of a new P-256 key."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private.decode(), public.decode()


def put_signed_client(
    stubs: Stubs, tenant: str, url: str, client_id: str, private_pem: str
) -> connection_pb2.Connection:
    http = connection_pb2.HttpTransport(
        url=url,
        protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
        oauth_client_credentials=connection_pb2.OAuthClientCredentials(
            client_id=client_id,
            private_key_jwt=connection_pb2.OAuthPrivateKeyJwt(
                private_key_pem=private_pem, algorithm="ES256"
            ),
            scopes=["mcp"],
        ),
    )
    connection = connection_pb2.Connection(tenant=tenant, name="signed", http=http)
    return stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    ).connection


def test_client_credentials_with_a_private_key_jwt(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    private_pem, public_pem = _key_pair()
    client_id = f"signed-{tenant}"
    create_client(server, client_id=client_id, public_key_pem=public_pem)
    before = token_auth(server)["private_key_jwt"]
    put = put_signed_client(stubs, tenant, url_of(server), client_id, private_pem)
    assert put.state == connection_pb2.CONNECTION_STATE_CONNECTED, put.last_error
    assert not put.http.oauth_client_credentials.private_key_jwt.private_key_pem
    assert token_auth(server)["private_key_jwt"] > before
    host = Host(stubs, tenant)
    outcome = host.call(host.run(f"spec-{tenant}"), "signed", "echo", text="signed")
    assert result_text(outcome) == "signed"


def test_a_private_key_jwt_signed_with_another_key_is_refused(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    """The control of the test above: the server does check the assertion's signature."""
    _, public_pem = _key_pair()
    other_private_pem, _ = _key_pair()
    client_id = f"signed-{tenant}"
    create_client(server, client_id=client_id, public_key_pem=public_pem)
    put = put_signed_client(stubs, tenant, url_of(server), client_id, other_private_pem)
    assert put.state == connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED
    assert (
        put.authorization_required_reason
        == connection_pb2.AUTHORIZATION_REQUIRED_REASON_CREDENTIALS_REFUSED
    )


def test_insufficient_scope_needs_a_sign_in_that_asks_for_the_scope_too(
    stubs: Stubs, tenant: str
) -> None:
    with running(oauth_server(free_port(), "--step-up-scope", "admin")) as stepping:
        put_oauth(stubs, tenant, "stepping", url_of(stepping))
        first = begin(stubs, tenant, "stepping")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(first.authorization_url).query)
        assert query["scope"] == ["mcp"]
        code, state = browse(first.authorization_url)
        assert complete(stubs, tenant, code, state).state == (
            connection_pb2.CONNECTION_STATE_CONNECTED
        )
        host = Host(stubs, tenant)
        run_id = host.run(f"spec-{tenant}")
        assert result_text(host.call(run_id, "stepping", "echo", text="before")) == "before"

        httpx.post(f"http://127.0.0.1:{stepping.port}/admin/require-scope?on=1", timeout=10)
        outcome = host.call(run_id, "stepping", "echo", text="refused")
        assert outcome.is_error
        assert "sign in again" in result_text(outcome)
        # The host reads why in the outcome itself, not in ListConnections a moment later.
        assert (
            outcome.authorization_required_reason
            == connection_pb2.AUTHORIZATION_REQUIRED_REASON_SCOPE_MISSING
        )
        connection = wait_for(
            lambda: (
                listed(stubs, tenant)["stepping"]
                if listed(stubs, tenant)["stepping"].state
                == connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED
                else None
            ),
            "the connection needs authorizing",
        )
        assert (
            connection.authorization_required_reason
            == connection_pb2.AUTHORIZATION_REQUIRED_REASON_SCOPE_MISSING
        )

        again = begin(stubs, tenant, "stepping")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(again.authorization_url).query)
        assert set(query["scope"][0].split()) == {"mcp", "admin"}
        code, state = browse(again.authorization_url)
        assert complete(stubs, tenant, code, state).state == (
            connection_pb2.CONNECTION_STATE_CONNECTED
        )
        assert result_text(host.call(run_id, "stepping", "echo", text="after")) == "after"


def test_a_scope_refused_after_initialize_is_asked_for_at_the_first_sign_in(
    stubs: Stubs, tenant: str
) -> None:
    """A server that lets initialize through without a token and refuses what follows (401
    naming the scopes it wants): the first sign-in asks for them, and the connection
    connects."""
    with running(
        oauth_server(free_port(), "--step-up-scope", "admin", "--open-initialize")
    ) as opened:
        put_oauth(stubs, tenant, "opened", url_of(opened))
        first = begin(stubs, tenant, "opened")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(first.authorization_url).query)
        assert set(query["scope"][0].split()) == {"mcp", "admin"}
        code, state = browse(first.authorization_url)
        connection = complete(stubs, tenant, code, state)
        assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED, connection
        host = Host(stubs, tenant)
        run_id = host.run(f"spec-{tenant}")
        assert result_text(host.call(run_id, "opened", "echo", text="in")) == "in"


def test_a_server_of_the_stateless_revision_names_its_scope_to_server_discover(
    stubs: Stubs, tenant: str
) -> None:
    """A server that refuses the dated revisions' initialize (400) and challenges
    `server/discover` without a token (401 naming the scopes it wants): the first sign-in asks
    for the challenged scopes, not only the metadata's scopes_supported ("mcp")."""
    with running(
        oauth_server(
            free_port(), "--step-up-scope", "admin", "--open-initialize", "--refuse-initialize"
        )
    ) as modern:
        put_oauth(stubs, tenant, "modern", url_of(modern))
        first = begin(stubs, tenant, "modern")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(first.authorization_url).query)
        assert set(query["scope"][0].split()) == {"mcp", "admin"}
        code, state = browse(first.authorization_url)
        connection = complete(stubs, tenant, code, state)
        assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED, connection


def test_a_listing_refused_for_a_scope_is_signed_in_again_with_it(
    stubs: Stubs, tenant: str
) -> None:
    """initialize passes, tools/list is refused 403 insufficient_scope: the connection needs
    a sign-in that asks for the granted scope and the challenged one, and then connects. Until
    the user signs in, the sidecar sends the server nothing more."""
    with running(oauth_server(free_port(), "--step-up-scope", "admin")) as stepping:
        put_oauth(stubs, tenant, "listing", url_of(stepping))
        sign_in(stubs, tenant, "listing")
        admin_post(stepping, "require-scope?on=1&method=tools/list")
        failure = rpc_failure(
            lambda: stubs.connections.RefreshCatalog(
                connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name="listing")
            )
        )
        assert failure.code == UNAVAILABLE, failure
        connection = wait_for(
            lambda: (
                listed(stubs, tenant)["listing"]
                if listed(stubs, tenant)["listing"].state
                == connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED
                else None
            ),
            "the connection needs authorizing",
        )
        assert (
            connection.authorization_required_reason
            == connection_pb2.AUTHORIZATION_REQUIRED_REASON_SCOPE_MISSING
        )
        again = begin(stubs, tenant, "listing")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(again.authorization_url).query)
        assert set(query["scope"][0].split()) == {"mcp", "admin"}
        code, state = browse(again.authorization_url)
        connection = complete(stubs, tenant, code, state)
        assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED, connection


def test_a_connection_never_signed_in_is_not_told_to_sign_in_again(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    put = put_oauth(stubs, tenant, "fresh", url_of(server))
    assert "again" not in put.last_error
    assert "needs the user to sign in" in put.last_error
    host = Host(stubs, tenant)
    run_id = host.run(f"spec-{tenant}")
    outcome = host.call(run_id, "fresh", "echo", text="hello")
    assert outcome.is_error
    assert "again" not in result_text(outcome), result_text(outcome)
    assert (
        outcome.authorization_required_reason
        == connection_pb2.AUTHORIZATION_REQUIRED_REASON_NEVER_SIGNED_IN
    )
    # A call the model made, dispatched, says so too.
    dispatched = host.dispatch(
        run_id, "mcp_call_tool", {"server": "fresh", "tool": "echo", "input": {"text": "hi"}}
    )
    assert dispatched.outcome.is_error, dispatched
    assert (
        dispatched.outcome.authorization_required_reason
        == connection_pb2.AUTHORIZATION_REQUIRED_REASON_NEVER_SIGNED_IN
    ), dispatched


def test_a_client_id_metadata_document_url_signs_in_without_registering(
    stubs: Stubs, tenant: str
) -> None:
    document_url = f"https://client.example/{tenant}/client.json"
    with running(oauth_server(free_port(), "--client-id-metadata-documents")) as documented:
        httpx.post(
            f"http://127.0.0.1:{documented.port}/admin/client-documents",
            json={
                "url": document_url,
                "document": {
                    "client_id": document_url,
                    "client_name": "psych-sidecar",
                    "redirect_uris": [REDIRECT_URI],
                    "token_endpoint_auth_method": "none",
                },
            },
            timeout=10,
        )
        http = connection_pb2.HttpTransport(
            url=url_of(documented),
            protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
            oauth_authorization_code=connection_pb2.OAuthAuthorizationCode(
                client_metadata_url=document_url, redirect_uri=REDIRECT_URI
            ),
        )
        connection = connection_pb2.Connection(tenant=tenant, name="documented", http=http)
        stubs.connections.PutConnection(
            connection_service_pb2.PutConnectionRequest(connection=connection)
        )
        started = begin(stubs, tenant, "documented")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(started.authorization_url).query)
        assert query["client_id"] == [document_url]
        code, state = browse(started.authorization_url)
        signed_in = complete(stubs, tenant, code, state, "documented")
        assert signed_in.state == connection_pb2.CONNECTION_STATE_CONNECTED, signed_in.last_error
        assert stats(documented)["registrations"] == 0
        assert token_auth(documented)["none"] >= 1  # a public client: no secret, no assertion
        host = Host(stubs, tenant)
        outcome = host.call(host.run(f"spec-{tenant}"), "documented", "echo", text="cimd")
        assert result_text(outcome) == "cimd"

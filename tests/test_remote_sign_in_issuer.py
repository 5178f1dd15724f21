"""A client's credentials go to the authorization server they are bound to and no other, a
server that moves to another authorization server gets a new sign-in there, and the
authorization response's `iss` (RFC 9207) is checked. Two instances of the project's OAuth test
server on loopback (tests/mcp_servers/oauth_server.py): the MCP server with its own
authorization server, and another authorization server its metadata can be made to name; a
real sidecar on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx2 as httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import create_engine, select, update

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from psych_sidecar.storage import tables
from tests.support.connections import listed
from tests.support.databases import TEST_SECRET_KEY
from tests.support.host import Host, result_text
from tests.support.oauth_sign_in import (
    REDIRECT_URI,
    begin,
    complete,
    oauth_server,
    presented_codes,
    put_oauth,
    redirect_query,
    sign_in,
    stats,
    token_auth,
    url_of,
)
from tests.support.polling import wait_for
from tests.support.processes import HttpServer, free_port, running
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture(scope="module")
def server() -> Iterator[HttpServer]:
    """The MCP server, with its own authorization server."""
    with running(oauth_server(free_port())) as started:
        yield started


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[HttpServer]:
    """Another authorization server, which the MCP server's metadata can be made to name."""
    with running(oauth_server(free_port())) as started:
        yield started


@pytest.fixture(scope="module")
def stubs(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stubs]:
    directory: Path = tmp_path_factory.mktemp("issuer")
    settings = flat_settings(
        listen=[f"unix://{directory / 's.sock'}"],
        database_url=database_url,
        data_dir=directory,
        shutdown_grace_seconds=5,
        secret_keys=TEST_SECRET_KEY,
        oauth_allow_http_loopback=True,
        mcp_reconnect_min_seconds=0.2,
        mcp_reconnect_max_seconds=1.0,
    )
    with RunningSidecar(settings) as sidecar, sidecar.stubs() as stubs:
        yield stubs


@pytest.fixture
def tenant() -> str:
    return f"tenant-{time.monotonic_ns()}"


def base_of(server: HttpServer) -> str:
    return f"http://127.0.0.1:{server.port}"


def issuer_of(server: HttpServer) -> str:
    """The issuer as the server's authorization-server metadata spells it."""
    metadata = httpx.get(f"{base_of(server)}/.well-known/oauth-authorization-server", timeout=10)
    issuer: str = metadata.json()["issuer"]
    return issuer


def token_requests(server: HttpServer) -> int:
    """How many token requests the server received, whatever their client authentication."""
    return sum(token_auth(server).values())


def put_registered(
    stubs: Stubs, tenant: str, server: HttpServer, *, secret: str, issuer: str
) -> None:
    client_id = f"registered-{tenant}"
    created = httpx.post(
        f"{base_of(server)}/admin/clients",
        json={"client_id": client_id, "client_secret": secret, "redirect_uri": REDIRECT_URI},
        timeout=10,
    )
    created.raise_for_status()
    http = connection_pb2.HttpTransport(
        url=url_of(server),
        protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
        oauth_authorization_code=connection_pb2.OAuthAuthorizationCode(
            registered_client=connection_pb2.OAuthRegisteredClient(
                client_id=client_id, client_secret=secret, issuer=issuer
            ),
            redirect_uri=REDIRECT_URI,
        ),
    )
    connection = connection_pb2.Connection(tenant=tenant, name="registered", http=http)
    put = stubs.connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection)
    ).connection
    assert put.http.oauth_authorization_code.registered_client.issuer == issuer


def assert_issuer_mismatch(
    call: Callable[[], object], connection: str, *, bound: str, named: str
) -> None:
    failure = rpc_failure(call)
    assert failure.code == FAILED_PRECONDITION
    assert failure.info.reason == "OAUTH_ISSUER_MISMATCH"
    assert dict(failure.info.metadata) == {
        "connection": connection,
        "bound_issuer": bound,
        "named_issuer": named,
    }
    assert bound in failure.message
    assert named in failure.message


def test_a_registered_client_secret_goes_to_its_issuer_only(
    stubs: Stubs, server: HttpServer, elsewhere: HttpServer, tenant: str
) -> None:
    put_registered(
        stubs, tenant, server, secret="secret-of-the-home-server", issuer=issuer_of(server)
    )
    received = token_requests(elsewhere), stats(elsewhere)["registrations"]
    httpx.post(
        f"{base_of(server)}/admin/authorization-server",
        params={"url": base_of(elsewhere)},
        timeout=10,
    ).raise_for_status()
    try:
        assert_issuer_mismatch(
            lambda: begin(stubs, tenant, "registered"),
            "registered",
            bound=issuer_of(server),
            named=issuer_of(elsewhere),
        )
    finally:
        httpx.post(
            f"{base_of(server)}/admin/authorization-server", params={"url": ""}, timeout=10
        ).raise_for_status()
    # Nothing reached the other authorization server's token or registration endpoint.
    assert (token_requests(elsewhere), stats(elsewhere)["registrations"]) == received
    # Its own issuer named again: the sign-in goes through.
    signed_in = sign_in(stubs, tenant, "registered")
    assert signed_in.state == connection_pb2.CONNECTION_STATE_CONNECTED, signed_in.last_error


def test_a_registered_client_without_issuer_is_bound_to_its_first_sign_in(
    stubs: Stubs, server: HttpServer, elsewhere: HttpServer, tenant: str
) -> None:
    put_registered(stubs, tenant, server, secret="secret-bound-on-first-use", issuer="")
    signed_in = sign_in(stubs, tenant, "registered")
    assert signed_in.state == connection_pb2.CONNECTION_STATE_CONNECTED, signed_in.last_error
    received = token_requests(elsewhere)
    admin = f"{base_of(server)}/admin/authorization-server"
    httpx.post(admin, params={"url": base_of(elsewhere)}, timeout=10).raise_for_status()
    try:
        assert_issuer_mismatch(
            lambda: begin(stubs, tenant, "registered"),
            "registered",
            bound=issuer_of(server),
            named=issuer_of(elsewhere),
        )
        # The session's own renewals go to the authorization server that issued its grant.
        host = Host(stubs, tenant)
        host.call(host.run(f"spec-{tenant}"), "registered", "echo", text="moved")
    finally:
        httpx.post(admin, params={"url": ""}, timeout=10).raise_for_status()
    assert token_requests(elsewhere) == received


def test_a_grant_stored_before_issuers_were_kept_binds_its_registered_client(
    stubs: Stubs, server: HttpServer, elsewhere: HttpServer, tenant: str, database_url: str
) -> None:
    """A connection signed in by an earlier version: its grant's metadata has no issuer as
    spelled, only the metadata model's; the client is bound to that one, no migration."""
    put_registered(stubs, tenant, server, secret="secret-of-an-older-grant", issuer="")
    sign_in(stubs, tenant, "registered")
    grants = tables.oauth_grants
    key = (grants.c.tenant == tenant, grants.c.name == "registered")
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            stored = json.loads(connection.execute(select(grants.c.metadata).where(*key)).one()[0])
            assert stored.pop("issuer") == issuer_of(server)
            connection.execute(update(grants).where(*key).values(metadata=json.dumps(stored)))
    finally:
        engine.dispose()
    received = token_requests(elsewhere)
    admin = f"{base_of(server)}/admin/authorization-server"
    httpx.post(admin, params={"url": base_of(elsewhere)}, timeout=10).raise_for_status()
    try:
        assert_issuer_mismatch(
            lambda: begin(stubs, tenant, "registered"),
            "registered",
            bound=issuer_of(server),
            named=issuer_of(elsewhere),
        )
    finally:
        httpx.post(admin, params={"url": ""}, timeout=10).raise_for_status()
    assert token_requests(elsewhere) == received


def _private_key_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


@pytest.mark.parametrize("credential", ["client_secret", "private_key_jwt"])
def test_client_credentials_go_to_their_issuer_only(
    stubs: Stubs,
    server: HttpServer,
    elsewhere: HttpServer,
    tenant: str,
    credential: str,
) -> None:
    settings = connection_pb2.OAuthClientCredentials(
        client_id=f"machine-{tenant}", scopes=["mcp"], issuer=issuer_of(server)
    )
    if credential == "client_secret":
        settings.client_secret = "machine-secret"
    else:
        settings.private_key_jwt.private_key_pem = _private_key_pem()
        settings.private_key_jwt.algorithm = "ES256"
    received = token_requests(elsewhere)
    admin = f"{base_of(server)}/admin/authorization-server"
    httpx.post(admin, params={"url": base_of(elsewhere)}, timeout=10).raise_for_status()
    try:
        http = connection_pb2.HttpTransport(
            url=url_of(server),
            protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
            oauth_client_credentials=settings,
        )
        connection = connection_pb2.Connection(tenant=tenant, name="machine", http=http)
        put = stubs.connections.PutConnection(
            connection_service_pb2.PutConnectionRequest(connection=connection)
        ).connection
    finally:
        httpx.post(admin, params={"url": ""}, timeout=10).raise_for_status()
    # Unreachable, saying why: the credentials would have gone to another issuer.
    assert put.state == connection_pb2.CONNECTION_STATE_UNREACHABLE
    assert issuer_of(server) in put.last_error
    assert issuer_of(elsewhere) in put.last_error
    assert token_requests(elsewhere) == received


def test_a_server_that_moves_to_another_authorization_server_gets_a_new_sign_in_there(
    stubs: Stubs, server: HttpServer, elsewhere: HttpServer, tenant: str
) -> None:
    put_oauth(stubs, tenant, "tracker", url_of(server))
    first = begin(stubs, tenant, "tracker")
    first_client = _query(first.authorization_url)["client_id"]
    answer = redirect_query(first.authorization_url)
    signed_in = complete(stubs, tenant, answer["code"], answer["state"], "tracker")
    assert signed_in.state == connection_pb2.CONNECTION_STATE_CONNECTED, signed_in.last_error
    host = Host(stubs, tenant)
    run_id = host.run(f"spec-{tenant}")
    assert result_text(host.call(run_id, "tracker", "echo", text="before")) == "before"
    registrations = stats(elsewhere)["registrations"]

    admin = f"{base_of(server)}/admin/authorization-server"
    httpx.post(admin, params={"url": base_of(elsewhere)}, timeout=10).raise_for_status()
    try:
        outcome = host.call(run_id, "tracker", "echo", text="moved")
        assert outcome.is_error
        assert "sign in again" in result_text(outcome)

        def required() -> connection_pb2.Connection | None:
            connection = listed(stubs, tenant)["tracker"]
            needs = connection.state == connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED
            return connection if needs else None

        wait_for(required, "the connection needs a sign-in")
        again = begin(stubs, tenant, "tracker")
        # At the new authorization server, as a client registered there: the old one's
        # client is not presented to it.
        assert again.authorization_url.startswith(f"{base_of(elsewhere)}/authorize?")
        assert _query(again.authorization_url)["client_id"] != first_client
        assert stats(elsewhere)["registrations"] == registrations + 1
        answer = redirect_query(again.authorization_url)
        signed_in = complete(stubs, tenant, answer["code"], answer["state"], "tracker")
        assert signed_in.state == connection_pb2.CONNECTION_STATE_CONNECTED, signed_in.last_error
        assert result_text(host.call(run_id, "tracker", "echo", text="after")) == "after"
    finally:
        httpx.post(admin, params={"url": ""}, timeout=10).raise_for_status()


def _query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


@pytest.fixture
def iss_answer(server: HttpServer) -> Iterator[Callable[[str, bool], None]]:
    """Sets what `iss` the authorization response carries and whether the metadata advertises
    it; back to neither afterwards."""
    admin = f"{base_of(server)}/admin/iss"

    def answer(mode: str, advertised: bool) -> None:
        params = {"mode": mode, "advertise": "1" if advertised else "0"}
        httpx.post(admin, params=params, timeout=10).raise_for_status()

    yield answer
    httpx.post(admin, params={"mode": "omit"}, timeout=10).raise_for_status()


@pytest.mark.parametrize(
    ("mode", "advertised"),
    [("correct", True), ("correct", False), ("omit", False)],
)
def test_an_authorization_response_from_the_right_issuer_signs_in(
    stubs: Stubs,
    server: HttpServer,
    tenant: str,
    iss_answer: Callable[[str, bool], None],
    mode: str,
    advertised: bool,
) -> None:
    iss_answer(mode, advertised)
    put_oauth(stubs, tenant, "tracker", url_of(server))
    started = begin(stubs, tenant, "tracker")
    answer = redirect_query(started.authorization_url)
    assert answer.get("iss") == (issuer_of(server) if mode == "correct" else None)
    signed_in = complete(
        stubs, tenant, answer["code"], answer["state"], "tracker", answer.get("iss")
    )
    assert signed_in.state == connection_pb2.CONNECTION_STATE_CONNECTED, signed_in.last_error
    assert answer["code"] in presented_codes(server)


@pytest.mark.parametrize(
    ("mode", "advertised"),
    [("omit", True), ("wrong", True), ("wrong", False), ("normalized", True)],
)
def test_an_authorization_response_from_another_issuer_is_refused(
    stubs: Stubs,
    server: HttpServer,
    tenant: str,
    iss_answer: Callable[[str, bool], None],
    mode: str,
    advertised: bool,
) -> None:
    iss_answer(mode, advertised)
    put_oauth(stubs, tenant, "tracker", url_of(server))
    started = begin(stubs, tenant, "tracker")
    answer = redirect_query(started.authorization_url)
    failure = rpc_failure(
        lambda: complete(
            stubs, tenant, answer["code"], answer["state"], "tracker", answer.get("iss")
        )
    )
    assert failure.code == FAILED_PRECONDITION
    assert failure.info.reason == "SIGN_IN_ISSUER_MISMATCH"
    assert dict(failure.info.metadata) == {
        "tenant": tenant,
        "connection": "tracker",
        "issuer": issuer_of(server),
        "iss": answer.get("iss", ""),
    }
    # The code was not exchanged (counted by code: other tests' connections to this server may
    # renew or retry meanwhile), and the state is spent.
    assert answer["code"] not in presented_codes(server)
    again = rpc_failure(
        lambda: complete(
            stubs, tenant, answer["code"], answer["state"], "tracker", issuer_of(server)
        )
    )
    assert again.info.reason == "SIGN_IN_STATE_USED"
    assert listed(stubs, tenant)["tracker"].state == (
        connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED
    )


@pytest.mark.parametrize("issuer", ["not a url", "https://auth.example.com/\nx"])
def test_a_registered_client_issuer_that_is_no_url_is_refused(
    stubs: Stubs, server: HttpServer, tenant: str, issuer: str
) -> None:
    http = connection_pb2.HttpTransport(
        url=url_of(server),
        protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
        oauth_authorization_code=connection_pb2.OAuthAuthorizationCode(
            registered_client=connection_pb2.OAuthRegisteredClient(
                client_id="registered", client_secret="secret", issuer=issuer
            ),
            redirect_uri=REDIRECT_URI,
        ),
    )
    connection = connection_pb2.Connection(tenant=tenant, name="registered", http=http)
    failure = rpc_failure(
        lambda: stubs.connections.PutConnection(
            connection_service_pb2.PutConnectionRequest(connection=connection)
        )
    )
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT
    assert failure.info.reason == "FIELD_INVALID"
    assert failure.info.metadata["field"] == (
        "connection.http.oauth_authorization_code.registered_client.issuer"
    )

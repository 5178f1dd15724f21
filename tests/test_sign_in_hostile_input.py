"""Hostile input at the sign-in's edges: every URL and number an OAuth or MCP server hands the
sidecar (metadata URLs, redirect Locations, expires_in, registration answers), and every URL
a host puts in a connection, is parsed once where it arrives and refused with a typed error;
and the outbound address guard judges the IPv4 address an IPv6 one carries (IPv4-mapped,
IPv4-compatible, NAT64, 6to4, Teredo). Against a real sidecar over gRPC, the project's OAuth
test server and a hostile one on loopback (tests/support/hostile_oauth.py)."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import pytest

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from psych_sidecar.config import Settings
from tests.support.connections import listed
from tests.support.databases import TEST_SECRET_KEY
from tests.support.host import Host, result_text
from tests.support.hostile_oauth import (
    CHALLENGE,
    REGISTER,
    RESOURCE,
    TOKEN,
    Answer,
    HostileOAuthServer,
    hostile_oauth_server,
)
from tests.support.oauth_sign_in import (
    REDIRECT_URI,
    begin,
    browse,
    complete,
    oauth_server,
    put_oauth,
    sign_in,
    stats,
    url_of,
)
from tests.support.polling import wait_for
from tests.support.processes import HttpServer, free_port, running
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
# docs/security.md: a token's expires_in is clamped to at most a year.
A_YEAR = timedelta(days=365)


def sidecar_settings(tmp_path: Path, **overrides: Any) -> Settings:
    return Settings(
        **{
            "listen": [f"unix://{tmp_path / 's.sock'}"],
            "database_url": f"sqlite:///{tmp_path / 'sidecar.db'}",
            "data_dir": tmp_path,
            "shutdown_grace_seconds": 5,
            "secret_keys": TEST_SECRET_KEY,
            "oauth_allow_http_loopback": True,
            "oauth_request_timeout_seconds": 2,
            "mcp_reconnect_min_seconds": 0.2,
            "mcp_reconnect_max_seconds": 1.0,
            **overrides,
        }
    )


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileOAuthServer]:
    yield from hostile_oauth_server()


@pytest.fixture(scope="module")
def server() -> Iterator[HttpServer]:
    with running(oauth_server(free_port(), "--token-seconds", "2")) as started:
        yield started


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stubs]:
    directory = tmp_path_factory.mktemp("hostile-input")
    with RunningSidecar(sidecar_settings(directory)) as sidecar, sidecar.stubs() as stubs:
        yield stubs


@pytest.fixture
def tenant() -> str:
    return f"tenant-{time.monotonic_ns()}"


def put_http(
    stubs: Stubs, tenant: str, url: str, redirect_uri: str = REDIRECT_URI
) -> connection_pb2.Connection:
    http = connection_pb2.HttpTransport(
        url=url,
        protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
        oauth_authorization_code=connection_pb2.OAuthAuthorizationCode(
            dynamic_registration=connection_pb2.OAuthDynamicRegistration(),
            redirect_uri=redirect_uri,
        ),
    )
    connection = connection_pb2.Connection(tenant=tenant, name="hostile", http=http)
    request = connection_service_pb2.PutConnectionRequest(connection=connection)
    return stubs.connections.PutConnection(request).connection


# URLs a host puts: refused at PutConnection, with the parser the sign-in uses ---------------


@pytest.mark.parametrize(
    ("url", "redirect_uri", "field"),
    [
        ("http://127.0.0.1:99999/mcp", REDIRECT_URI, "connection.http.url"),
        ("http://[::1/mcp", REDIRECT_URI, "connection.http.url"),
        ("http://[::1", REDIRECT_URI, "connection.http.url"),
        ("http://0177.0.0.1:8000/mcp", REDIRECT_URI, "connection.http.url"),
        ("https://0300.0000.0002.0002/mcp", REDIRECT_URI, "connection.http.url"),
        # The MCP SDK's URL type (pydantic's) refuses these; a pattern of "http(s)://host..."
        # took them, and BeginSignIn failed on them.
        (
            "http://127.0.0.1:8000/mcp",
            "http://xn--/callback",
            "connection.http.oauth_authorization_code.redirect_uri",
        ),
        (
            "http://127.0.0.1:8000/mcp",
            "http://[fe80::1%25eth0]/callback",
            "connection.http.oauth_authorization_code.redirect_uri",
        ),
        (
            "http://127.0.0.1:8000/mcp",
            "http://127.0.0.1:99999/callback",
            "connection.http.oauth_authorization_code.redirect_uri",
        ),
    ],
)
def test_a_url_the_sign_in_could_not_parse_is_refused_when_the_connection_is_put(
    stubs: Stubs, tenant: str, url: str, redirect_uri: str, field: str
) -> None:
    failure = rpc_failure(lambda: put_http(stubs, tenant, url, redirect_uri))
    assert (failure.code, failure.info.reason) == (INVALID_ARGUMENT, "FIELD_INVALID")
    assert failure.info.metadata["field"] == field
    assert failure.info.metadata["detail"].startswith("must be an http:// or https:// URL: ")


# URLs an OAuth server hands the sidecar: refused where they arrive ---------------------------


HOSTILE_URLS = ["https://0300.0000.0002.0002/", "http://[::1/x"]


@pytest.mark.parametrize("pointed", HOSTILE_URLS)
def test_a_metadata_url_the_server_points_at_is_refused_typed(
    stubs: Stubs, hostile: HostileOAuthServer, tenant: str, pointed: str
) -> None:
    hostile.script(
        **{CHALLENGE: Answer(401, (("www-authenticate", f'Bearer resource_metadata="{pointed}"'),))}
    )
    put_http(stubs, tenant, f"{hostile.base}/mcp")
    failure = rpc_failure(lambda: begin(stubs, tenant, "hostile"))
    assert (failure.code, failure.info.reason) == (PERMISSION_DENIED, "OAUTH_URL_REFUSED")
    assert "not a valid http(s) URL" in failure.info.metadata["detail"]
    assert hostile.asked("/register") == 0


@pytest.mark.parametrize("location", HOSTILE_URLS)
def test_a_redirect_location_is_refused_typed(
    stubs: Stubs, hostile: HostileOAuthServer, tenant: str, location: str
) -> None:
    hostile.script(**{RESOURCE: Answer(302, (("location", location),))})
    put_http(stubs, tenant, f"{hostile.base}/mcp")
    failure = rpc_failure(lambda: begin(stubs, tenant, "hostile"))
    assert (failure.code, failure.info.reason) == (PERMISSION_DENIED, "OAUTH_URL_REFUSED")
    assert "not a valid http(s) URL" in failure.info.metadata["detail"]
    assert hostile.asked("/.well-known/oauth-protected-resource") == 1


def test_a_registration_for_private_key_jwt_is_refused_at_registration(
    stubs: Stubs, hostile: HostileOAuthServer, tenant: str
) -> None:
    answer = Answer.of_json(
        {
            "client_id": "hostile-client",
            "redirect_uris": [REDIRECT_URI],
            "token_endpoint_auth_method": "private_key_jwt",
        },
        201,
    )
    hostile.script(**{REGISTER: answer})
    put_http(stubs, tenant, f"{hostile.base}/mcp")
    failure = rpc_failure(lambda: begin(stubs, tenant, "hostile"))
    assert (failure.code, failure.info.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "OAUTH_REGISTRATION_FAILED",
    )
    assert "private_key_jwt" in failure.info.metadata["detail"]
    assert hostile.asked("/token") == 0


# expires_in: clamped to at most a year, on the first grant and on a refresh ----------------


def token_expire_time(connection: connection_pb2.Connection) -> datetime:
    assert connection.HasField("token_expire_time")
    return connection.token_expire_time.ToDatetime(tzinfo=UTC)


@pytest.mark.parametrize("expires_in", [10**12, 10**30])
def test_a_first_grant_of_absurd_lifetime_is_held_for_at_most_a_year(
    stubs: Stubs, hostile: HostileOAuthServer, tenant: str, expires_in: int
) -> None:
    token = {"access_token": "a", "token_type": "Bearer", "expires_in": expires_in}
    hostile.script(**{TOKEN: Answer.of_json(token)})
    put_http(stubs, tenant, f"{hostile.base}/mcp")
    started = begin(stubs, tenant, "hostile")
    before = datetime.now(UTC)
    connection = complete(stubs, tenant, "any-code", started.state, "hostile")
    assert before < token_expire_time(connection) <= datetime.now(UTC) + A_YEAR


@pytest.mark.parametrize("expires_in", [10**12, 10**30])
def test_a_refresh_of_absurd_lifetime_keeps_the_connection_usable(
    stubs: Stubs, server: HttpServer, tenant: str, expires_in: int
) -> None:
    put_oauth(stubs, tenant, "tracker", url_of(server))
    signed_in = sign_in(stubs, tenant, "tracker")
    assert signed_in.state == connection_pb2.CONNECTION_STATE_CONNECTED, signed_in.last_error
    httpx.post(
        f"http://127.0.0.1:{server.port}/admin/claim-expires-in?seconds={expires_in}", timeout=10
    ).raise_for_status()
    try:
        host = Host(stubs, tenant)
        run_id = host.run(f"spec-{tenant}")
        refreshes = stats(server)["refreshes"]

        def refreshed_call() -> str | None:
            # Tokens live 2 s: a call renews them once they are about to expire.
            outcome = host.call(run_id, "tracker", "echo", text="after")
            assert not outcome.is_error, result_text(outcome)
            return "refreshed" if stats(server)["refreshes"] > refreshes else None

        wait_for(refreshed_call, "a call after a refresh", every=0.2)
        connection = listed(stubs, tenant)["tracker"]
        assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED, connection.last_error
        assert token_expire_time(connection) <= datetime.now(UTC) + A_YEAR
        outcome = host.call(run_id, "tracker", "echo", text="still")
        assert result_text(outcome) == "still"
    finally:
        httpx.post(
            f"http://127.0.0.1:{server.port}/admin/claim-expires-in?seconds=0", timeout=10
        ).raise_for_status()


def test_the_authorization_url_still_carries_the_state_browse_reads(
    stubs: Stubs, server: HttpServer, tenant: str
) -> None:
    # The parser at the edge lets the well-behaved sign-in through unchanged.
    put_oauth(stubs, tenant, "tracker", url_of(server))
    started = begin(stubs, tenant, "tracker")
    code, state = browse(started.authorization_url)
    assert state == started.state
    connection = complete(stubs, tenant, code, state, "tracker")
    assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED, connection.last_error


# The address guard: the IPv4 address an IPv6 one carries -----------------------------------

# Each form carries 127.0.0.1, where a listener waits that must receive nothing.
EMBEDDED_FORMS = [
    ("::ffff:127.0.0.1", "IPv4-mapped"),
    ("::127.0.0.1", "IPv4-compatible"),
    ("64:ff9b::127.0.0.1", "NAT64"),
    ("64:ff9b:1::7f00:1", "local-use NAT64"),
    ("2002:7f00:1::1", "6to4"),
    # Teredo: server 65.54.227.120, client 127.0.0.1 (its bits inverted in the last 32).
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo"),
]


@pytest.fixture(scope="module")
def guarded_stubs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stubs]:
    # No loopback for OAuth requests: the embedded 127.0.0.1 is refused by the guard's rules.
    # (The MCP connection's own URL is the host's to choose, and is not guarded: its 401 is
    # what names the hostile metadata URL.)
    directory = tmp_path_factory.mktemp("guard")
    settings = sidecar_settings(directory, oauth_allow_http_loopback=False)
    with RunningSidecar(settings) as sidecar, sidecar.stubs() as stubs:
        yield stubs


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock


def connected_to(listener: socket.socket) -> bool:
    readable, _, _ = select.select([listener], [], [], 0)
    return bool(readable)


@pytest.mark.parametrize(("address", "form"), EMBEDDED_FORMS)
def test_an_ipv6_address_carrying_a_loopback_ipv4_one_is_refused(
    guarded_stubs: Stubs,
    hostile: HostileOAuthServer,
    listener: socket.socket,
    tenant: str,
    address: str,
    form: str,
) -> None:
    port = listener.getsockname()[1]
    pointed = f"https://[{address}]:{port}/.well-known/oauth-protected-resource"
    hostile.script(
        **{CHALLENGE: Answer(401, (("www-authenticate", f'Bearer resource_metadata="{pointed}"'),))}
    )
    put_http(guarded_stubs, tenant, f"{hostile.base}/mcp")
    failure = rpc_failure(lambda: begin(guarded_stubs, tenant, "hostile"))
    assert (failure.code, failure.info.reason) == (PERMISSION_DENIED, "OAUTH_URL_REFUSED")
    assert form in failure.info.metadata["detail"]
    assert not connected_to(listener)

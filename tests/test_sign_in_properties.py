"""Property: whatever URLs, numbers and JSON a host or a hostile OAuth server hands the sign-in,
every OAuth entry point answers a typed status with exactly one ErrorInfo (or succeeds), never
INTERNAL or UNKNOWN, and the sidecar stays SERVING.

The entry points: PutConnection with OAuth settings, BeginSignIn (discovery and registration
against a hostile server on loopback answering with generated bodies, statuses and Location
headers, tests/support/hostile_oauth.py), CompleteSignIn (its token endpoint answering with
generated bodies) and a refresh (the session that follows a sign-in meets the server's 401 and
renews with the same generated token answer). A real sidecar over gRPC. Sized to run in well
under a minute."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from psych_sidecar.config import Settings
from tests.support.databases import TEST_SECRET_KEY
from tests.support.hostile_oauth import (
    CHALLENGE,
    REGISTER,
    RESOURCE,
    SERVER,
    TOKEN,
    Answer,
    HostileOAuthServer,
    hostile_oauth_server,
)
from tests.support.oauth_sign_in import REDIRECT_URI
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar, Stubs

T = TypeVar("T")
TENANT = "hostile-fuzz"
EXAMPLES = 40
names = (f"c{index}" for index in itertools.count())

# Hosts biased to what parsers disagree on, and to loopback (nothing here waits on an
# unreachable address: the guard refuses the others before connecting).
HOSTS = [
    "127.0.0.1",
    "localhost",
    "[::1]",
    "0300.0000.0002.0002",
    "0177.0.0.1",
    "127.1",
    "2130706433",
    "0x7f.0.0.1",
    "[::1",
    "::1]",
    "[::ffff:127.0.0.1]",
    "[::127.0.0.1]",
    "[64:ff9b::7f00:1]",
    "[64:ff9b:1::7f00:1]",
    "[2002:7f00:1::1]",
    "[2001:0:4136:e378:8000:63bf:80ff:fffe]",
    "[fe80::1%25eth0]",
    "[v1.x]",
    "169.254.169.254",
    "10.0.0.1",
    "xn--",
    "é.example",
    "a..b",
    "-a.example",
    "user:pw@127.0.0.1",
    "@",
    "",
    "a b",
    "h\\x",
]
EDGE_URLS = [
    "https://0300.0000.0002.0002/",
    "http://[::1/x",
    "http://127.0.0.1:99999/",
    "http://[::1",
    "http://0177.0.0.1/",
    "//127.0.0.1/x",
    "/relative",
    "javascript:alert(1)",
    "http:///x",
    "http://127.0.0.1:0/",
    "http://127.0.0.1:-1/",
    "http://127.0.0.1:+80/",
    "http://127.0.0.1/\x7f",
    "http://127.0.0.1/" + "a" * 5000,
]


# Addresses nothing answers at: requested (a connection's own URL is not guarded), they
# would cost a request timeout each.
UNANSWERED = ("169.254.169.254", "10.0.0.1")


def urls(port: int, *, requested: bool = False) -> st.SearchStrategy[str]:
    """URLs; `requested`: ones the sidecar requests without the guard (a connection's own)."""
    hosts = [host for host in HOSTS if not (requested and host in UNANSWERED)]
    structured = st.builds(
        "{}://{}{}{}".format,
        st.sampled_from(["http", "https", "HTTP", "ftp", "", "http:"]),
        st.sampled_from(hosts),
        st.one_of(
            st.just(""),
            st.just(f":{port}"),
            st.integers(-1, 10**6).map(lambda n: f":{n}"),
            st.text("0123456789:x", max_size=6).map(lambda text: f":{text}"),
        ),
        st.text(max_size=20).map(lambda path: "/" + path),
    )
    return st.one_of(structured, st.sampled_from(EDGE_URLS), st.text(max_size=40))


NUMBERS = st.one_of(
    st.integers(-(10**40), 10**40),
    st.sampled_from([0, -1, 1, 10**12, 10**30, 2**63, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=10),
    st.none(),
)
JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def header_text(text: str) -> bool:
    return "\r" not in text and "\n" not in text and all(ord(c) < 256 for c in text)


def answers(good: Answer, values: st.SearchStrategy[Any], port: int) -> st.SearchStrategy[Answer]:
    """An answer: the well-behaved one with some members replaced by hostile values or
    dropped, any JSON, bytes that are not JSON, another status, or a redirect."""
    document = json.loads(good.body or b"{}")

    def mutated(changes: dict[str, Any], dropped: list[str]) -> Answer:
        body = {**document, **changes}
        for key in dropped:
            body.pop(key, None)
        return Answer.of_json(body, good.status)

    return st.one_of(
        st.builds(
            mutated,
            st.dictionaries(st.sampled_from(sorted(document) or ["x"]), values, max_size=3),
            st.lists(st.sampled_from(sorted(document) or ["x"]), max_size=2),
        ),
        JSON.map(Answer.of_json),
        st.binary(max_size=30).map(lambda body: Answer(200, (), body)),
        st.sampled_from([204, 301, 400, 401, 404, 429, 500, 503]).map(
            lambda status: Answer(status, (), good.body)
        ),
        st.tuples(st.sampled_from([301, 302, 307, 308]), urls(port).filter(header_text)).map(
            lambda redirect: Answer(redirect[0], (("location", redirect[1]),))
        ),
    )


def sidecar_settings(tmp_path: Path) -> Settings:
    return flat_settings(
        listen=[f"unix://{tmp_path / 's.sock'}"],
        database_url=f"sqlite:///{tmp_path / 'sidecar.db'}",
        data_dir=tmp_path,
        shutdown_grace_seconds=5,
        secret_keys=TEST_SECRET_KEY,
        oauth_allow_http_loopback=True,
        oauth_request_timeout_seconds=5,
        mcp_reconnect_min_seconds=0.5,
        mcp_reconnect_max_seconds=2.0,
        # No search warm-up thread importing numpy while hypothesis looks for it.
        semantic_search="off",
    )


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileOAuthServer]:
    yield from hostile_oauth_server()


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSidecar]:
    with RunningSidecar(sidecar_settings(tmp_path_factory.mktemp("fuzz-sign-in"))) as running:
        yield running


@pytest.fixture(scope="module")
def stubs(sidecar: RunningSidecar) -> Iterator[Stubs]:
    with sidecar.stubs() as stubs:
        yield stubs


@pytest.fixture(scope="module")
def health(sidecar: RunningSidecar) -> Iterator[Callable[[], int]]:
    with grpc.insecure_channel(sidecar.sidecar.bound[0]) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        yield lambda: stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status


def typed(call: Callable[[], T]) -> T | None:
    """The call's answer, or None when it failed with a typed status (one ErrorInfo, never
    INTERNAL or UNKNOWN)."""
    try:
        return call()
    except grpc.RpcError as failure:
        error: Any = failure
        assert error.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
            error.code(),
            error.details(),
        )
        status = rpc_status.from_call(error)
        assert status is not None, (error.code(), error.details())
        infos = [
            detail for detail in status.details if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)
        ]
        assert len(infos) == 1, (error.code(), error.details())
        return None


def put(
    stubs: Stubs, name: str, url: str, redirect_uri: str = REDIRECT_URI
) -> connection_pb2.Connection | None:
    http = connection_pb2.HttpTransport(
        url=url,
        protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
        oauth_authorization_code=connection_pb2.OAuthAuthorizationCode(
            dynamic_registration=connection_pb2.OAuthDynamicRegistration(),
            redirect_uri=redirect_uri,
        ),
    )
    request = connection_service_pb2.PutConnectionRequest(
        connection=connection_pb2.Connection(tenant=TENANT, name=name, http=http)
    )
    return typed(lambda: stubs.connections.PutConnection(request).connection)


def begin(stubs: Stubs, name: str) -> connection_service_pb2.BeginSignInResponse | None:
    request = connection_service_pb2.BeginSignInRequest(tenant=TENANT, name=name)
    return typed(lambda: stubs.connections.BeginSignIn(request))


def delete(stubs: Stubs, name: str) -> None:
    request = connection_service_pb2.DeleteConnectionRequest(tenant=TENANT, name=name)
    typed(lambda: stubs.connections.DeleteConnection(request))


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_put_connection_and_begin_sign_in_with_generated_urls(
    stubs: Stubs, hostile: HostileOAuthServer, health: Callable[[], int]
) -> None:
    hostile.script()

    @FUZZ
    @given(url=urls(hostile.port, requested=True), redirect_uri=urls(hostile.port))
    @example(url=f"{hostile.base}/mcp", redirect_uri="http://127.0.0.1:99999/callback")
    @example(url="http://[::1", redirect_uri=REDIRECT_URI)
    def check(url: str, redirect_uri: str) -> None:
        name = next(names)
        if put(stubs, name, url, redirect_uri) is not None:
            begin(stubs, name)
            delete(stubs, name)

    check()
    assert health() == health_pb2.HealthCheckResponse.SERVING


def test_begin_sign_in_against_generated_discovery_and_registration(
    stubs: Stubs, hostile: HostileOAuthServer, health: Callable[[], int]
) -> None:
    good = hostile.well_behaved()
    port = hostile.port
    url_values = st.one_of(urls(port), JSON)
    challenge = st.one_of(
        st.builds(
            lambda status, pointed, scope: Answer(
                status,
                (("www-authenticate", f'Bearer resource_metadata="{pointed}", scope="{scope}"'),),
            ),
            st.sampled_from([401, 403, 200, 500]),
            urls(port),
            st.text(max_size=10),
        ).filter(lambda answer: all(header_text(v) for _, v in answer.headers)),
        st.just(good[CHALLENGE]),
    )

    @FUZZ
    @given(
        challenge=challenge,
        resource=answers(good[RESOURCE], url_values, port),
        server=answers(good[SERVER], url_values, port),
        register=answers(
            good[REGISTER], st.one_of(JSON, st.sampled_from(["private_key_jwt"])), port
        ),
    )
    @example(
        challenge=good[CHALLENGE],
        resource=Answer(302, (("location", "https://0300.0000.0002.0002/"),)),
        server=good[SERVER],
        register=good[REGISTER],
    )
    def check(challenge: Answer, resource: Answer, server: Answer, register: Answer) -> None:
        hostile.script(
            **{CHALLENGE: challenge, RESOURCE: resource, SERVER: server, REGISTER: register}
        )
        name = next(names)
        assert put(stubs, name, f"{hostile.base}/mcp") is not None
        begin(stubs, name)
        delete(stubs, name)

    check()
    assert health() == health_pb2.HealthCheckResponse.SERVING


def test_complete_sign_in_and_refresh_against_generated_token_answers(
    stubs: Stubs, hostile: HostileOAuthServer, health: Callable[[], int]
) -> None:
    good = hostile.well_behaved()
    token_values = st.one_of(NUMBERS, JSON, st.sampled_from(["Bearer", "bearer", "MAC"]))
    tokens = st.one_of(
        answers(good[TOKEN], token_values, hostile.port),
        st.builds(
            lambda expires_in: Answer.of_json(
                {
                    "access_token": "a",
                    "token_type": "Bearer",
                    "expires_in": expires_in,
                    "refresh_token": "r",
                }
            ),
            NUMBERS,
        ),
    )

    @FUZZ
    @given(token=tokens, code=st.text(max_size=30))
    @example(
        token=Answer.of_json(
            {
                "access_token": "a",
                "token_type": "Bearer",
                "expires_in": 10**30,
                "refresh_token": "r",
            }
        ),
        code="c",
    )
    def check(token: Answer, code: str) -> None:
        hostile.script(**{TOKEN: token})
        name = next(names)
        assert put(stubs, name, f"{hostile.base}/mcp") is not None
        started = begin(stubs, name)
        if started is None:
            # Typed (the hostile server answers at once; only a loaded machine gets here).
            delete(stubs, name)
            return
        request = connection_service_pb2.CompleteSignInRequest(
            tenant=TENANT, state=started.state, code=code, name=name
        )
        if typed(lambda: stubs.connections.CompleteSignIn(request)) is not None:
            # Signed in: the session meets the server's 401 and renews with the same answer.
            refresh = connection_service_pb2.RefreshCatalogRequest(tenant=TENANT, name=name)
            typed(lambda: stubs.connections.RefreshCatalog(refresh))
            listing = connection_service_pb2.ListConnectionsRequest(tenant=TENANT)
            assert typed(lambda: stubs.connections.ListConnections(listing)) is not None
        delete(stubs, name)

    check()
    assert health() == health_pb2.HealthCheckResponse.SERVING

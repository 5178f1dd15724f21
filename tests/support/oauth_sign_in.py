"""Signing a user in to an OAuth-protected MCP server: the project's OAuth test server
(tests/mcp_servers/oauth_server.py), a connection that needs it, the user's browser and what
the server reports it issued."""

from __future__ import annotations

import sys
import urllib.parse
from pathlib import Path

import httpx2 as httpx

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from tests.support.processes import HttpServer
from tests.support.sidecar import Stubs

OAUTH_SERVER = Path(__file__).parent.parent / "mcp_servers" / "oauth_server.py"
REDIRECT_URI = "http://127.0.0.1:9/callback"


def oauth_server(port: int, *extra: str) -> HttpServer:
    return HttpServer([sys.executable, str(OAUTH_SERVER), "--port", str(port), *extra], port)


def url_of(server: HttpServer) -> str:
    return f"http://127.0.0.1:{server.port}/mcp"


def put_oauth(stubs: Stubs, tenant: str, name: str, url: str) -> connection_pb2.Connection:
    http = connection_pb2.HttpTransport(
        url=url,
        protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP,
        oauth_authorization_code=connection_pb2.OAuthAuthorizationCode(
            dynamic_registration=connection_pb2.OAuthDynamicRegistration(),
            redirect_uri=REDIRECT_URI,
        ),
    )
    connection = connection_pb2.Connection(tenant=tenant, name=name, http=http)
    request = connection_service_pb2.PutConnectionRequest(connection=connection)
    return stubs.connections.PutConnection(request).connection


def begin(stubs: Stubs, tenant: str, name: str) -> connection_service_pb2.BeginSignInResponse:
    return stubs.connections.BeginSignIn(
        connection_service_pb2.BeginSignInRequest(tenant=tenant, name=name)
    )


def redirect_query(authorization_url: str) -> dict[str, str]:
    """What the user's browser does: open the URL, consent, land on the redirect URI; the
    redirect's query parameters (`code`, `state`, maybe `iss`), read off the redirect instead
    of following it."""
    response = httpx.get(authorization_url, follow_redirects=False, timeout=10)
    assert response.status_code in (302, 303, 307), response.text
    location = response.headers["location"]
    assert location.startswith(REDIRECT_URI)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)
    return {name: values[0] for name, values in query.items()}


def browse(authorization_url: str) -> tuple[str, str]:
    """The redirect's `code` and `state` (redirect_query)."""
    query = redirect_query(authorization_url)
    return query["code"], query["state"]


def complete(
    stubs: Stubs, tenant: str, code: str, state: str, name: str = "", iss: str | None = None
) -> connection_pb2.Connection:
    """CompleteSignIn as a host calls it: `iss` is the redirect's (None: it had none)."""
    request = connection_service_pb2.CompleteSignInRequest(
        tenant=tenant, state=state, code=code, name=name, iss=iss
    )
    return stubs.connections.CompleteSignIn(request).connection


def sign_in(stubs: Stubs, tenant: str, name: str) -> connection_pb2.Connection:
    started = begin(stubs, tenant, name)
    query = redirect_query(started.authorization_url)
    assert query["state"] == started.state
    return complete(stubs, tenant, query["code"], query["state"], name, query.get("iss"))


def issued_secrets(server: HttpServer) -> list[str]:
    """Every token and client secret the server issued and still honours."""
    answer: list[str] = httpx.get(
        f"http://127.0.0.1:{server.port}/admin/tokens", timeout=10
    ).json()["secrets"]
    return answer


def stats(server: HttpServer) -> dict[str, int]:
    answer: dict[str, int] = httpx.get(
        f"http://127.0.0.1:{server.port}/admin/stats", timeout=10
    ).json()
    return answer


def token_auth(server: HttpServer, client_id: str | None = None) -> dict[str, int]:
    """How many token requests the server saw per client authentication method: of one client,
    or of all."""
    params = {} if client_id is None else {"client_id": client_id}
    answer: dict[str, int] = httpx.get(
        f"http://127.0.0.1:{server.port}/admin/token-auth", params=params, timeout=10
    ).json()
    return answer


def presented_codes(server: HttpServer) -> list[str]:
    """Every authorization code the server's token endpoint was given, by any client."""
    codes: list[str] = httpx.get(
        f"http://127.0.0.1:{server.port}/admin/presented-codes", timeout=10
    ).json()
    return codes


def admin_post(server: HttpServer, path: str) -> None:
    httpx.post(f"http://127.0.0.1:{server.port}/admin/{path}", timeout=10).raise_for_status()


def held_token_requests(server: HttpServer, count: int, within: float) -> int:
    """How many token requests the server holds, answered once it holds `count` (or after
    `within` seconds, when it does not)."""
    answer: int = httpx.get(
        f"http://127.0.0.1:{server.port}/admin/held-tokens",
        params={"count": count, "within": within},
        timeout=within + 10,
    ).json()["held"]
    return answer

"""No credential leaves the sidecar, in any spelling: a real `psych-sidecar serve` process at
DEBUG log level, an OAuth-protected server (tests/mcp_servers/oauth_server.py) that echoes the
bearer token it refuses in its WWW-Authenticate, and an access token that holds CR/LF (no HTTP
header may carry it: the HTTP client's refusal quotes it, escaped). Neither token, raw,
repr-escaped, JSON-escaped or percent-encoded, is in a gRPC reply or error, a tool result, the
sidecar's log (stdout and stderr), the admin listener's /ui pages and /metrics, or the
`inspect` command's output."""

from __future__ import annotations

import json
import secrets
import urllib.parse
from collections.abc import Iterator

import grpc
import httpx2 as httpx
import pytest

from psych.sidecar.v1 import connection_pb2, connection_service_pb2
from psych_sidecar import cli
from tests.support.connections import listed
from tests.support.host import Host, result_text
from tests.support.oauth_sign_in import (
    admin_post,
    issued_secrets,
    oauth_server,
    put_oauth,
    sign_in,
    url_of,
)
from tests.support.polling import wait_for
from tests.support.processes import HttpServer, ServedSidecar, free_port, running
from tests.support.sidecar import Stubs

TENANT = "credentials"


def spellings(secret: str) -> set[str]:
    """The secret as a library or a template might quote it."""
    forms = {
        secret,
        repr(secret)[1:-1],
        repr(secret.encode())[2:-1],
        json.dumps(secret)[1:-1],
        urllib.parse.quote(secret, safe=""),
        urllib.parse.quote_plus(secret),
    }
    forms.update(line for line in secret.splitlines() if len(line) >= 8)
    return forms


def assert_nowhere(secrets_: list[str], where: str, text: str) -> None:
    for secret in secrets_:
        for form in spellings(secret):
            assert form not in text, f"{where} quotes a credential as {form!r}"


@pytest.fixture(scope="module")
def server() -> Iterator[HttpServer]:
    # Tokens that outlive the test: every one it issues is still listed at the end.
    with running(oauth_server(free_port(), "--token-seconds", "600")) as started:
        yield started


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedSidecar]:
    directory = tmp_path_factory.mktemp("credentials")
    socket = directory / "s.sock"
    served = ServedSidecar(
        "--listen",
        f"unix://{socket}",
        "--database-url",
        f"sqlite:///{directory / 'sidecar.db'}",
        "--data-dir",
        str(directory),
        "--admin-listen",
        f"127.0.0.1:{free_port()}",
        "--log-level",
        "debug",
        "--semantic-search",
        "off",
        "--oauth-allow-http-loopback",
        "--mcp-reconnect-min-seconds",
        "0.2",
        "--mcp-reconnect-max-seconds",
        "1",
        health=f"unix:{socket}",
    )
    try:
        served.wait_serving()
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def stubs(sidecar: ServedSidecar) -> Iterator[Stubs]:
    assert sidecar.health is not None
    with grpc.insecure_channel(sidecar.health) as channel:
        yield Stubs.on(channel)


def admin_url(sidecar: ServedSidecar) -> str:
    return sidecar.flags[sidecar.flags.index("--admin-listen") + 1]


def test_no_credential_in_replies_results_logs_pages_metrics_or_inspect(
    sidecar: ServedSidecar,
    stubs: Stubs,
    server: HttpServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    host = Host(stubs, TENANT)
    run_id = host.run("credentials-spec")
    texts: dict[str, str] = {}

    # A server that echoes the token it refuses, in a 403's WWW-Authenticate.
    put_oauth(stubs, TENANT, "echoing", url_of(server))
    signed = sign_in(stubs, TENANT, "echoing")
    assert signed.state == connection_pb2.CONNECTION_STATE_CONNECTED, signed.last_error
    echoed = issued_secrets(server)
    admin_post(server, "echo-token?on=1")
    try:
        outcome = host.call(run_id, "echoing", "echo", text="refused")
        assert outcome.is_error
        texts["the echoing call's result"] = result_text(outcome)
        assert "is refused" in texts["the echoing call's result"]
        # One signed in meanwhile fails to connect: its last_error quotes the challenge.
        put_oauth(stubs, TENANT, "echo-connect", url_of(server))
        texts["CompleteSignIn (echo-connect)"] = str(sign_in(stubs, TENANT, "echo-connect"))
        wait_for(
            lambda: "is refused" in listed(stubs, TENANT)["echo-connect"].last_error,
            lambda: f"the echo-connect connection to fail: {listed(stubs, TENANT)}",
        )
        outcome = host.call(run_id, "echo-connect", "echo", text="unreachable")
        texts["the echo-connect call's result"] = result_text(outcome)
    finally:
        admin_post(server, "echo-token?on=0")
    texts["ListConnections (echoing)"] = str(listed(stubs, TENANT))

    # An access token holding CR/LF: the HTTP client refuses to send it, quoting it.
    canary = f"canary-{secrets.token_hex(12)}\r\ntail-{secrets.token_hex(12)}"
    httpx.post(
        f"http://127.0.0.1:{server.port}/admin/next-access-token",
        json={"token": canary},
        timeout=10,
    ).raise_for_status()
    put_oauth(stubs, TENANT, "canary", url_of(server))
    completed = sign_in(stubs, TENANT, "canary")
    texts["CompleteSignIn"] = str(completed)
    wait_for(
        lambda: (
            listed(stubs, TENANT)["canary"].state == connection_pb2.CONNECTION_STATE_UNREACHABLE
        ),
        "the canary connection to be unreachable",
    )
    canary_connection = listed(stubs, TENANT)["canary"]
    assert "Illegal header value" in canary_connection.last_error, canary_connection.last_error
    texts["ListConnections (canary)"] = str(canary_connection)
    outcome = host.call(run_id, "canary", "echo", text="never sent")
    assert outcome.is_error
    texts["the canary call's result"] = outcome.result_json.decode()
    try:
        stubs.connections.RefreshCatalog(
            connection_service_pb2.RefreshCatalogRequest(tenant=TENANT, name="canary")
        )
    except grpc.RpcError as error:
        texts["RefreshCatalog's error"] = f"{error.details()} {error.trailing_metadata()}"

    base = f"http://{admin_url(sidecar)}"
    for page in (f"/ui/connections?tenant={TENANT}", f"/ui/runs/{run_id}", f"/ui?tenant={TENANT}"):
        response = httpx.get(base + page, timeout=10)
        assert response.status_code == 200, page
        texts[page] = response.text
    texts["/metrics"] = httpx.get(f"{base}/metrics", timeout=10).text
    assert sidecar.health is not None
    assert cli.main(["inspect", "connections", TENANT, "--address", sidecar.health]) == 0
    texts["inspect connections"] = capsys.readouterr().out
    assert "canary" in texts["inspect connections"]

    sidecar.stop()
    texts["the sidecar's log"] = sidecar.log
    assert "DEBUG" in texts["the sidecar's log"]
    credentials = [canary, *echoed, *issued_secrets(server)]
    for where, text in texts.items():
        assert_nowhere(credentials, where, text)

"""A token refresh holds no storage thread, transaction or lock while the token endpoint
answers: a sidecar whose storage has two threads keeps serving other RPCs while ten
connections' refreshes hang on a token endpoint that holds them, and once it answers each
connection is refreshed exactly once (a real `psych-sidecar serve` process over gRPC, against
tests/mcp_servers/oauth_server.py). What stands in for the lock is the grant's refresh claim
in storage: one claimant at a time, until it stores, releases, or its claim expires. On
SQLite, and on PostgreSQL under scripts/with-postgres."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from psych.sidecar.v1 import connection_pb2, connection_service_pb2, run_service_pb2
from psych_sidecar.domain.catalog import OAuthGrant, RefreshClaim
from psych_sidecar.secrets.cipher import KeyRing
from psych_sidecar.storage.engines import create_database_engine
from psych_sidecar.storage.migrate import migrate
from psych_sidecar.storage.oauth import SqlOAuthStore
from tests.support.connections import listed
from tests.support.databases import (
    POSTGRES_URL_ENV,
    WITH_PGBOUNCER,
    database_of_kind,
    pooling_of,
)
from tests.support.host import Host
from tests.support.oauth_sign_in import (
    admin_post,
    held_token_requests,
    oauth_server,
    put_oauth,
    sign_in,
    stats,
    url_of,
)
from tests.support.processes import ServedSidecar, free_port, running
from tests.support.requests import user
from tests.support.sidecar import UNLIMITED_CHANNEL, Stubs

CONNECTIONS = 10
STORAGE_THREADS = 2
# The deadline of every RPC the test waits on, and its bound on waiting for the held requests.
DEADLINE_SECONDS = 30.0


@pytest.fixture(params=WITH_PGBOUNCER)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param != "sqlite" and not os.environ.get(POSTGRES_URL_ENV):
        pytest.skip("needs PostgreSQL (scripts/with-postgres)")
    with database_of_kind(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def stubs(database_url: str, tmp_path: Path) -> Iterator[Stubs]:
    socket_path = tmp_path / "s.sock"
    served = ServedSidecar(
        "--listen",
        f"unix://{socket_path}",
        "--database-url",
        database_url,
        env={
            "PSYCH_SIDECAR_WORKER_THREADS": str(STORAGE_THREADS),
            "PSYCH_SIDECAR_DATABASE_POOLING": pooling_of(database_url),
            "PSYCH_SIDECAR_OAUTH_ALLOW_HTTP_LOOPBACK": "true",
            # The held token requests must not time out while the test looks.
            "PSYCH_SIDECAR_OAUTH_REQUEST_TIMEOUT_SECONDS": str(4 * DEADLINE_SECONDS),
        },
    )
    channel = grpc.insecure_channel(f"unix:{socket_path}", options=UNLIMITED_CHANNEL)
    try:
        served.wait_serving()
        yield Stubs.on(channel)
    finally:
        channel.close()
        served.stop_cleanly()


def test_a_two_thread_storage_pool_serves_other_rpcs_while_ten_refreshes_hang(
    stubs: Stubs,
) -> None:
    tenant = "t"
    names = [f"remote{index}" for index in range(CONNECTIONS)]
    # Tokens that do not expire during the test: the only refreshes are the ones it causes.
    with running(oauth_server(free_port(), "--token-seconds", "3600")) as server:
        for name in names:
            put_oauth(stubs, tenant, name, url_of(server))
            assert sign_in(stubs, tenant, name).state == connection_pb2.CONNECTION_STATE_CONNECTED
        host = Host(stubs, tenant)
        run_id = host.run("spec-refresh-load")
        before = stats(server)

        # Every access token refused (so every connection's next request renews), and every
        # token request held: ten refreshes hang, one per connection.
        admin_post(server, "hold-tokens?on=1")
        admin_post(server, "refuse-access?on=1")
        refreshes = [
            stubs.connections.RefreshCatalog.future(
                connection_service_pb2.RefreshCatalogRequest(tenant=tenant, name=name),
                timeout=4 * DEADLINE_SECONDS,
            )
            for name in names
        ]
        try:
            held = held_token_requests(server, CONNECTIONS, within=DEADLINE_SECONDS)
            assert held == CONNECTIONS, f"only {held} refreshes reached the token endpoint"

            # Meanwhile the storage threads serve everyone else.
            appended = stubs.runs.AppendRecords(
                run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[user("meanwhile")]),
                timeout=DEADLINE_SECONDS,
            )
            assert len(appended.records) == 1
            run = stubs.runs.GetRun(
                run_service_pb2.GetRunRequest(run_id=run_id), timeout=DEADLINE_SECONDS
            ).run
            assert run.run_id == run_id
            connections = stubs.connections.ListConnections(
                connection_service_pb2.ListConnectionsRequest(tenant=tenant, page_size=100),
                timeout=DEADLINE_SECONDS,
            ).connections
            assert sorted(c.name for c in connections) == names
            assert not any(refresh.done() for refresh in refreshes)
        finally:
            admin_post(server, "refuse-access?on=0")
            admin_post(server, "hold-tokens?on=0")

        for refresh in refreshes:
            refresh.result()
        after = stats(server)
        assert after["refreshes"] - before["refreshes"] == CONNECTIONS
        assert after["rejected_refreshes"] == before["rejected_refreshes"]
        states = {name: c.state for name, c in listed(stubs, tenant).items()}
        assert states == dict.fromkeys(names, connection_pb2.CONNECTION_STATE_CONNECTED)


def _always(grant: OAuthGrant) -> bool:
    return True


def test_a_refresh_claim_admits_one_claimant_until_it_stores_releases_or_expires(
    database_url: str,
) -> None:
    engine = create_database_engine(database_url, pool_size=2, pooling=pooling_of(database_url))
    try:
        migrate(engine)
        store = SqlOAuthStore(engine, KeyRing([bytes([7]) * 32]))
        grant = OAuthGrant(1, '{"access_token":"a0"}', "{}", "{}", None)
        refreshed = replace(grant, tokens_json='{"access_token":"a1"}')
        store.put_grant("t", "c", grant)
        assert store.claim_refresh("t", "absent", "first", 60, _always) is None

        assert store.claim_refresh("t", "c", "first", 60, _always) == RefreshClaim(
            grant, claimed=True
        )
        assert store.claim_refresh("t", "c", "second", 60, _always) == RefreshClaim(
            grant, held_elsewhere=True
        )
        # Only the claimant stores; then the grant needs nothing and no claim is left.
        assert store.store_refreshed("t", "c", "second", refreshed) == grant
        assert store.store_refreshed("t", "c", "first", refreshed) is refreshed
        assert store.claim_refresh(
            "t", "c", "second", 60, lambda current: current.tokens_json == grant.tokens_json
        ) == RefreshClaim(refreshed)

        # A released claim is free at once; an expired one is taken over.
        def claims(claimant: str, seconds: float) -> bool:
            found = store.claim_refresh("t", "c", claimant, seconds, _always)
            return found is not None and found.claimed

        assert claims("third", 60)
        store.release_refresh("t", "c", "third")
        assert claims("fourth", 0)
        assert claims("fifth", 60)

        # A new sign-in ends the claim: the refresh begun before it is not stored over it.
        signed_in = replace(grant, tokens_json='{"access_token":"signed-in"}')
        store.put_grant("t", "c", signed_in)
        assert store.store_refreshed("t", "c", "fifth", refreshed) == signed_in
        assert store.get_grant("t", "c") == signed_in
    finally:
        engine.dispose()

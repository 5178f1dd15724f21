"""Two sidecar processes on one PostgreSQL share an OAuth connection: one refreshes its
rotating tokens per expiry, the other uses the result, and pg_dump shows no token."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from psych.sidecar.v1 import connection_pb2
from tests.support.connections import listed
from tests.support.databases import POSTGRES_URL_ENV, postgres_database, raw_database_bytes
from tests.support.host import Host, result_text
from tests.support.oauth_sign_in import (
    issued_secrets,
    oauth_server,
    put_oauth,
    sign_in,
    stats,
    url_of,
)
from tests.support.processes import ServedSidecar, free_port, running
from tests.support.sidecar import UNLIMITED_CHANNEL, Stubs

pytestmark = pytest.mark.skipif(
    not os.environ.get(POSTGRES_URL_ENV), reason="needs PostgreSQL (scripts/with-postgres)"
)
TOKEN_SECONDS = 4
# A token is renewed a fifth of its lifetime before it expires (the refresh margin, capped at a
# fifth: `oauth_refresh_margin_seconds`), so one renewal comes every four fifths of a lifetime.
RENEWAL_SECONDS = TOKEN_SECONDS * 4 / 5


class Served:
    def __init__(self, socket_path: Path, database_url: str) -> None:
        self.served = ServedSidecar(
            "--listen",
            f"unix://{socket_path}",
            "--database-url",
            database_url,
            env={
                "PSYCH_SIDECAR_OAUTH_ALLOW_HTTP_LOOPBACK": "true",
                "PSYCH_SIDECAR_MCP_RECONNECT_MIN_SECONDS": "0.2",
                "PSYCH_SIDECAR_MCP_RECONNECT_MAX_SECONDS": "1",
            },
        )
        self.channel = grpc.insecure_channel(f"unix:{socket_path}", options=UNLIMITED_CHANNEL)
        self.stubs = Stubs.on(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.served.stop_cleanly()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[str, list[Served]]]:
    with postgres_database() as url:
        started = [Served(tmp_path / f"s{index}.sock", url) for index in range(2)]
        try:
            for sidecar in started:
                sidecar.served.wait_serving()
            yield url, started
        finally:
            for sidecar in started:
                sidecar.stop()


def test_two_sidecars_refresh_once_per_expiry_and_store_no_readable_token(
    pair: tuple[str, list[Served]],
) -> None:
    url, (first, second) = pair
    with running(oauth_server(free_port(), "--token-seconds", str(TOKEN_SECONDS))) as server:
        put_oauth(first.stubs, "t", "tracker", url_of(server))
        sign_in(first.stubs, "t", "tracker")
        hosts = [Host(first.stubs, "t"), Host(second.stubs, "t")]
        run_id = hosts[0].run("spec-scale")
        # The second sidecar starts its session at its first call, from what the first stored.
        warm = hosts[1].call(run_id, "tracker", "echo", text="warm")
        assert result_text(warm) == "warm"
        assert (
            listed(second.stubs, "t")["tracker"].state == connection_pb2.CONNECTION_STATE_CONNECTED
        )
        before = stats(server)
        started = time.monotonic()
        failures = []
        calls = 0
        while time.monotonic() - started < 3.5 * TOKEN_SECONDS:
            for host in hosts:
                outcome = host.call(run_id, "tracker", "echo", text=f"c{calls}")
                if outcome.is_error:
                    failures.append(result_text(outcome))
                calls += 1
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        after = stats(server)
        assert failures == []
        refreshes = after["refreshes"] - before["refreshes"]
        # One refresh per renewal, whichever sidecar made it: never both, never a spent
        # refresh token presented again. The first renewal may come at any point of the loop
        # (the token's age when it starts depends on how long the sign-in took), hence the +1;
        # a renewal may come later than its period (no call just then), hence the lower bound
        # counted in whole lifetimes. Both sidecars renewing would double the count.
        assert after["rejected_refreshes"] == before["rejected_refreshes"]
        most = int(elapsed / RENEWAL_SECONDS) + 1
        least = int(elapsed / TOKEN_SECONDS) - 1
        assert least <= refreshes <= most, (refreshes, elapsed)

        dump = raw_database_bytes(url)
        assert b"oauth_grants" in dump  # the positive control: the table was dumped
        for secret in issued_secrets(server):
            assert secret.encode() not in dump

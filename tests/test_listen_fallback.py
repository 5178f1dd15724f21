"""A server without subscriptions/listen: the session falls back to unprompted list_changed
notifications quietly (once, at DEBUG) and notes the protocol era in its state."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.connections import catalog_names, fixture_commands, put_stdio
from tests.support.polling import wait_for
from tests.support.sidecar import RunningSidecar, Stubs

# One listener: this is about MCP, not the gRPC transport.
SIDECAR_TRANSPORTS = ["unix"]


# The fixture server is an allowed command; a short debounce so a change shows quickly.
SIDECAR_OVERRIDES: dict[str, Any] = {
    "mcp_commands": fixture_commands(),
    "mcp_list_changed_debounce_seconds": 0.05,
}


@pytest.mark.parametrize(("args", "era"), [(["--no-listen"], "2025"), ([], "2026")])
def test_the_listen_fallback_is_quiet_and_the_era_is_noted(
    grpc_server: RunningSidecar,
    stubs: Stubs,
    unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
    args: list[str],
    era: str,
) -> None:
    tenant = unique("era")
    with caplog.at_level(logging.DEBUG, logger="psych_sidecar.mcp.catalog_refresh"):
        put_stdio(stubs, tenant, "srv", args=["--tools", "2", *args])
        session = grpc_server.sidecar.mcp.running_session(tenant, "srv")
        assert session is not None
        wait_for(lambda: session.catalog.protocol_era, "the protocol era")
        assert session.catalog.protocol_era == era
        wait_for(lambda: "bulk_000" in catalog_names(stubs, tenant, "srv"), "the listing")
    mine = [r for r in caplog.records if f"{tenant}/srv" in r.getMessage()]
    assert not [r for r in mine if "listen ended" in r.getMessage()]
    fallback = [r for r in mine if "no subscriptions/listen" in r.getMessage()]
    assert [r.levelno for r in fallback] == ([logging.DEBUG] if era == "2025" else [])

"""Deleting data outside RPCs: the sidecar's periodic expiry of Runs past `run_retention_hours`,
and the `prune` and `delete-tenant` commands (docs/operations.md, Deleting data)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from psych_sidecar.api.plumbing import Blocking
from psych_sidecar.domain.runlog import RunDeletion

log = logging.getLogger(__name__)

# How often a serving sidecar looks for expired Runs, and how many it deletes at most per
# look (each in a transaction of its own), so that a first pass over a large backlog does not
# hold a storage thread for long; the next pass continues.
RETENTION_PASS_SECONDS = 600.0
RETENTION_PASS_RUNS = 1000
# How long `prune` waits before trying again while another deleter holds the expiry.
_HELD_RETRY_SECONDS = 0.05

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str) -> timedelta:
    """`30d`, `12h`, `45m`, `90s` (a decimal number and a unit) as a timedelta."""
    match = _DURATION.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"not a duration: {value!r} (a number and s, m, h or d, e.g. 30d)")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


async def expire_runs_periodically(
    deletion: RunDeletion, blocking: Blocking, retention: timedelta
) -> None:
    """Until cancelled: every RETENTION_PASS_SECONDS (the first at once), delete the Runs
    created more than `retention` ago. A pass that fails (the database unreachable) is logged
    and the next one tries again."""
    while True:
        created_before = datetime.now(UTC) - retention
        try:
            done = await blocking(deletion.expire, created_before, RETENTION_PASS_RUNS)
        except Exception as error:  # the next pass retries; nothing is lost by waiting
            log.warning("run retention: the pass failed, retrying later: %s", error)
        else:
            if done.deleted:
                log.info(
                    "run retention: deleted %d runs created before %s",
                    len(done.deleted),
                    created_before.isoformat(timespec="seconds"),
                )
        await asyncio.sleep(RETENTION_PASS_SECONDS)


def prune(deletion: RunDeletion, engine: Engine, older_than: timedelta) -> str:
    """`psych-sidecar prune`: delete every Run created more than `older_than` ago, then give
    the space back (storage.deletion.reclaim_space); what it did, in one line."""
    from psych_sidecar.storage.deletion import database_bytes, reclaim_space

    created_before = datetime.now(UTC) - older_than
    before = database_bytes(engine)
    count = 0
    while True:
        done = deletion.expire(created_before, RETENTION_PASS_RUNS)
        count += len(done.deleted)
        if done.held_elsewhere:
            # A serving sidecar is deleting one now: they take turns, a Run at a time.
            time.sleep(_HELD_RETRY_SECONDS)
        elif len(done.deleted) < RETENTION_PASS_RUNS:
            break
    reclaim_space(engine)
    after = database_bytes(engine)
    return (
        f"pruned {count} runs created before {created_before.isoformat(timespec='seconds')}; "
        f"database {before} -> {after} bytes"
    )


def delete_tenant(deletion: RunDeletion, engine: Engine, tenant: str) -> str:
    """`psych-sidecar delete-tenant`: every Run, connection (with its sealed secrets),
    catalogue, OAuth grant and begun sign-in of the tenant; what it did, in one line."""
    from psych_sidecar.storage.deletion import reclaim_space

    runs, settings = deletion.delete_tenant(tenant)
    reclaim_space(engine)
    return (
        f"deleted tenant {tenant}: {runs} runs, {settings.connections} connections, "
        f"{settings.oauth_grants} oauth grants, {settings.sign_ins} sign-ins"
    )

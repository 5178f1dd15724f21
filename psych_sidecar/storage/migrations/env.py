"""Alembic environment: migrations run on the connection psych_sidecar.storage.migrate hands in.

Each migration applied (or reverted) is logged by its file's name and summary, not by
alembic's revision ids (the early ones keep ids from before the files were renamed, which mean
nothing to an operator); the CLI quiets alembic's own lines."""

import logging
from pathlib import Path
from typing import Any

from alembic import context
from alembic.runtime.migration import MigrationContext, MigrationInfo
from alembic.script import Script

from psych_sidecar.storage.tables import metadata

log = logging.getLogger("psych_sidecar.storage.migrations")


def _log_step(ctx: MigrationContext, step: MigrationInfo, heads: Any, run_args: Any) -> None:
    script = step.up_revision  # the migration applied, or reverted by a downgrade
    assert isinstance(script, Script)
    verb = "applied" if step.is_upgrade else "reverted"
    log.info("%s schema migration %s: %s", verb, Path(script.path).stem, script.doc)


connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=True,
    on_version_apply=_log_step,
)
with context.begin_transaction():
    context.run_migrations()

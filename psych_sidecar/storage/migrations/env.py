"""Alembic environment: migrations run on the connection psych_sidecar.storage.db hands in."""

from alembic import context

from psych_sidecar.storage.tables import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

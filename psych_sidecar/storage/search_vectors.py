"""SqlVectorStore: tool search's sentence vectors in SQL, shared by every sidecar on the
database (search/embeddings.py's VectorStore port)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from sqlalchemy import Engine, Insert, delete, select, tuple_
from sqlalchemy.dialects import sqlite

from psych_sidecar.storage import tables
from psych_sidecar.storage.transactions import read_transaction, write_transaction

# Keys per SELECT ... IN and rows per INSERT or DELETE: a 1,409-tool listing (2,818 texts)
# reads in six round trips, well under SQLite's limit on bound parameters.
_BATCH = 500
# Distinct catalogue texts fetched per round trip while the collection scans them.
_SCAN_BATCH = 2000


class SqlVectorStore:
    """Vectors by (encoder identity, text hash); inserts never overwrite (the same key always
    holds the same vector), so sidecars writing the same text at once do not conflict."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._insert: Insert
        if engine.dialect.name == "postgresql":
            # Imported here: its dialect costs a SQLite sidecar's start ~40 ms.
            from sqlalchemy.dialects import postgresql

            self._insert = postgresql.insert(tables.search_vectors).on_conflict_do_nothing()
        else:
            self._insert = sqlite.insert(tables.search_vectors).on_conflict_do_nothing()

    def read_vectors(self, encoder: str, keys: Sequence[str]) -> dict[str, bytes]:
        table = tables.search_vectors
        found: dict[str, bytes] = {}
        if not keys:
            return found
        with read_transaction(self._engine) as conn:
            for start in range(0, len(keys), _BATCH):
                rows = conn.execute(
                    select(table.c.text_hash, table.c.vector).where(
                        table.c.encoder == encoder,
                        table.c.text_hash.in_(keys[start : start + _BATCH]),
                    )
                )
                found.update((key, bytes(vector)) for key, vector in rows)
        return found

    def write_vectors(self, encoder: str, rows: Sequence[tuple[str, bytes]]) -> None:
        if not rows:
            return
        now = tables.now_us()
        values = [
            {"encoder": encoder, "text_hash": key, "vector": vector, "create_time_us": now}
            for key, vector in rows
        ]
        with write_transaction(self._engine) as conn:
            for start in range(0, len(values), _BATCH):
                conn.execute(self._insert, values[start : start + _BATCH])

    def vector_keys(self) -> list[tuple[str, str]]:
        table = tables.search_vectors
        with read_transaction(self._engine) as conn:
            return [(e, k) for e, k in conn.execute(select(table.c.encoder, table.c.text_hash))]

    def catalogue_listings(self) -> Iterator[list[tuple[str, str]]]:
        """For each server of each tenant, every distinct (tool name, description) of every
        catalogue version, current or not; streamed a server at a time."""
        catalog = tables.catalog_tools
        query = (
            select(catalog.c.tenant, catalog.c.server, catalog.c.name, catalog.c.description)
            .distinct()
            .order_by(catalog.c.tenant, catalog.c.server)
        )
        with read_transaction(self._engine) as conn:
            result = conn.execution_options(yield_per=_SCAN_BATCH).execute(query)
            for _, rows in itertools.groupby(result, key=lambda row: (row[0], row[1])):
                yield [(name, description) for _, _, name, description in rows]

    def delete_vectors(self, keys: Sequence[tuple[str, str]]) -> int:
        table = tables.search_vectors
        deleted = 0
        with write_transaction(self._engine) as conn:
            for start in range(0, len(keys), _BATCH):
                batch = list(keys[start : start + _BATCH])
                result = conn.execute(
                    delete(table).where(tuple_(table.c.encoder, table.c.text_hash).in_(batch))
                )
                deleted += result.rowcount
        return deleted

"""Table definitions. The schema itself is created and changed only by Alembic migrations;
a test checks that the migrated database matches these definitions."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

# Times are integer microseconds since the Unix epoch, UTC: exact and identical on
# SQLite and PostgreSQL.


def now_us() -> int:
    return time.time_ns() // 1000


def from_us(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC)


def to_us(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000)


def same_named(source: object, names: Iterable[str]) -> dict[str, Any]:
    """The values of `source`'s attributes `names`, by name: for the columns that hold their
    domain object's field of the same name unchanged, taken from the object to write a row
    and from the row to build the object."""
    return {name: getattr(source, name) for name in names}


specs = Table(
    "specs",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("version", BigInteger, primary_key=True, autoincrement=False),
    Column("body", Text, nullable=False),
    Column("fingerprint", String(64), nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", String(40), primary_key=True),
    Column("tenant", String(128), nullable=False, index=True),
    Column("spec_name", String(128), nullable=False),
    Column("spec_version", BigInteger, nullable=False),
    Column("tool_restrictions", Text, nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
    # The last sequence number handed out. Appends lock this row, which serialises
    # them per Run and keeps sequences gap-free across sidecars sharing a database.
    Column("last_sequence", BigInteger, nullable=False, server_default="0"),
    ForeignKeyConstraint(["spec_name", "spec_version"], ["specs.name", "specs.version"]),
)

records = Table(
    "records",
    metadata,
    Column("run_id", String(40), primary_key=True),
    Column("sequence", BigInteger, primary_key=True, autoincrement=False),
    Column("kind", String(32), nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
    Column("handle", String(40), nullable=True, unique=True),
    Column("call_id", Text, nullable=False),
    Column("server", Text, nullable=False),
    Column("tool", Text, nullable=False),
    Column("is_error", Boolean, nullable=False),
    # JSON list of [call_id, name, arguments_json] for assistant messages.
    Column("tool_calls", Text, nullable=False),
    # Total bytes of content, so a page can stop before it outgrows a gRPC message.
    Column("content_bytes", BigInteger, nullable=False),
    ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
    # The turn's start and the latest assistant step (MAX(sequence) of one kind in a Run),
    # asked by every ResolveTurn, AssemblePrompt and tool call, read without a scan.
    Index("ix_records_run_kind", "run_id", "kind", "sequence"),
)

# Content parts live in their own rows, as bytes (UTF-8 for text and JSON): exact,
# NUL-safe on PostgreSQL, and readable in slices without loading whole records.
record_parts = Table(
    "record_parts",
    metadata,
    Column("run_id", String(40), primary_key=True),
    Column("sequence", BigInteger, primary_key=True, autoincrement=False),
    Column("part_index", Integer, primary_key=True, autoincrement=False),
    Column("kind", String(16), nullable=False),
    Column("mime_type", Text, nullable=False),
    Column("data", LargeBinary, nullable=False),
    # Characters in a text or JSON part (NULL for binary), counted once at append.
    Column("char_count", BigInteger, nullable=True),
    ForeignKeyConstraint(["run_id", "sequence"], ["records.run_id", "records.sequence"]),
)

# The tool surface each turn of a Run was pinned with (keyed by the sequence of the user
# message that starts the turn): the first sidecar to resolve the turn writes it, every
# sidecar serves it for the rest of the turn.
turn_surfaces = Table(
    "turn_surfaces",
    metadata,
    Column("run_id", String(40), primary_key=True),
    Column("turn_start", BigInteger, primary_key=True, autoincrement=False),
    Column("surface", Text, nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
    ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
)

append_requests = Table(
    "append_requests",
    metadata,
    Column("run_id", String(40), primary_key=True),
    Column("request_id", String(128), primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    # JSON list of [sequence, handle]: the answer a retry gets back.
    Column("result", Text, nullable=False),
    # A tool call's MCP result JSON, as its first answer gave it, less the parts the log holds
    # (CallResultOutline): a retried call is answered with it, the record's parts spliced back
    # in at `call_result_splices` (JSON list of [offset, part index, spelling]), and does not
    # run the tool again. NULL for other appends.
    Column("call_result_outline", LargeBinary, nullable=True),
    Column("call_result_splices", Text, nullable=True),
    ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
)

# One row per model call's provider-reported usage. Metering reads only this table.
usage_events = Table(
    "usage_events",
    metadata,
    Column("run_id", String(40), primary_key=True),
    # The host's request id, or a generated one when it sent none.
    Column("event_id", String(128), primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    Column("model", Text, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("cache_read_tokens", BigInteger, nullable=False),
    Column("cache_write_tokens", BigInteger, nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
    ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
)

# A tenant's MCP connections. A deleted connection keeps its row (secrets wiped, delete time
# set) so that its catalogue versions stay readable and a new connection of the same name
# continues its version numbering.
connections = Table(
    "connections",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("name", String(64), primary_key=True),
    # Bumped on every put: sessions compare it to know whether they run the current config.
    Column("revision", BigInteger, nullable=False),
    Column("transport", String(16), nullable=False),
    Column("command", Text, nullable=False),
    Column("args", Text, nullable=False),
    # Secrets: needed to reconnect after a restart, never returned or logged. Each is a sealed
    # envelope of a JSON object (storage/connections.py); "{}" in a deleted connection's row.
    Column("env", Text, nullable=False),
    Column("url", Text, nullable=False),
    Column("headers", Text, nullable=False),
    # An HTTP connection's OAuth settings without their secrets (JSON; "" for the headers
    # alone), and its client secret or private key: an envelope, NULL when it has none.
    Column("auth", Text, nullable=False, server_default=""),
    Column("auth_secrets", Text, nullable=True),
    Column("preload", Boolean, nullable=True),
    Column("eager_tools", Text, nullable=False),
    Column("description", Text, nullable=False),
    Column("allow_tools", Text, nullable=False),
    Column("deny_tools", Text, nullable=False),
    # The newest catalogue version; 0 before the first successful listing.
    Column("catalog_version", BigInteger, nullable=False, server_default="0"),
    Column("create_time_us", BigInteger, nullable=False),
    Column("update_time_us", BigInteger, nullable=False),
    Column("delete_time_us", BigInteger, nullable=True),
)

# What an OAuth connection holds from its authorization server: one row per connection,
# written by a sign-in (or a client-credentials grant) and by every refresh. `tokens` and
# `client` are envelopes; `metadata` the discovered (public) metadata as JSON. `revision` is
# the connection's when granted: a replaced connection's tokens are not used.
oauth_grants = Table(
    "oauth_grants",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("revision", BigInteger, nullable=False),
    Column("tokens", Text, nullable=False),
    Column("client", Text, nullable=False),
    Column("metadata", Text, nullable=False),
    Column("expire_time_us", BigInteger, nullable=True),
    # Set (an AuthorizationReason) when the tokens are no longer usable.
    Column("authorization_reason", String(32), nullable=True),
    Column("update_time_us", BigInteger, nullable=False),
    # A refresh's claim, so that one sidecar refreshes at a time with no lock held over the
    # token request: who holds it (a random token) and until when; NULL when none.
    Column("refresh_claimant", String(64), nullable=True),
    Column("refresh_claim_until_us", BigInteger, nullable=True),
)

# Begun sign-ins, keyed by the SHA-256 of their state (the state itself is not stored).
# `secrets` is an envelope of the PKCE verifier and the client; single-use: `used_time_us`.
oauth_sign_ins = Table(
    "oauth_sign_ins",
    metadata,
    Column("state_digest", String(64), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("name", String(64), nullable=False),
    Column("revision", BigInteger, nullable=False),
    Column("secrets", Text, nullable=False),
    Column("metadata", Text, nullable=False),
    Column("scope", Text, nullable=False),
    Column("resource", Text, nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
    Column("expire_time_us", BigInteger, nullable=False),
    Column("used_time_us", BigInteger, nullable=True),
)

# One row per catalogue version of a connection: a version with no tools still exists.
catalog_versions = Table(
    "catalog_versions",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("server", String(64), primary_key=True),
    Column("catalog_version", BigInteger, primary_key=True, autoincrement=False),
    Column("tool_count", Integer, nullable=False),
    # SHA-256 of the listing, so a refresh that saw nothing new writes no version.
    Column("fingerprint", String(64), nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
    # The listed tools left out of the version (invalid definitions): how many, and the first
    # few as a JSON list of [name, reason] pairs.
    Column("rejected_tool_count", Integer, nullable=False, server_default="0"),
    Column("rejected_tools", Text, nullable=False, server_default="[]"),
    ForeignKeyConstraint(["tenant", "server"], ["connections.tenant", "connections.name"]),
)

# Every tool of every version, never deleted. A refresh inserts the whole listing at a new
# version, then stamps every older current row with that version as its removal marker.
catalog_tools = Table(
    "catalog_tools",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("server", String(64), primary_key=True),
    Column("catalog_version", BigInteger, primary_key=True, autoincrement=False),
    Column("name", Text, primary_key=True),
    Column("description", Text, nullable=False),
    # The server's JSON, byte for byte (empty when the server sent none).
    Column("input_schema", LargeBinary, nullable=False),
    Column("output_schema", LargeBinary, nullable=False),
    Column("annotations", LargeBinary, nullable=False),
    # The version that first no longer had the tool; 0 while it is current.
    Column("removed_in_version", BigInteger, nullable=False, server_default="0"),
    ForeignKeyConstraint(
        ["tenant", "server", "catalog_version"],
        [
            "catalog_versions.tenant",
            "catalog_versions.server",
            "catalog_versions.catalog_version",
        ],
    ),
    Index("ix_catalog_tools_current", "tenant", "server", "removed_in_version"),
)


def _zone_columns(zone: str) -> tuple[Column[Any], ...]:
    """A prompt zone's size in the assembly journal: bytes of its canonical JSON, estimated
    tokens, SHA-256."""
    return (
        Column(f"{zone}_bytes", BigInteger, nullable=False),
        Column(f"{zone}_tokens", BigInteger, nullable=False),
        Column(f"{zone}_sha256", String(64), nullable=False),
    )


# One row of metadata per AssemblePrompt (the assembly journal, for the Run inspector): never
# content. Rows older than the retention are deleted; nothing else reads or writes them.
assembly_journal = Table(
    "assembly_journal",
    metadata,
    Column("entry_id", String(40), primary_key=True),
    Column("run_id", String(40), nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
    Column("model", Text, nullable=False),
    Column("spec_name", String(128), nullable=False),
    Column("spec_version", BigInteger, nullable=False),
    Column("turn", BigInteger, nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("last_sequence", BigInteger, nullable=False),
    *_zone_columns("static"),
    *_zone_columns("tail"),
    *_zone_columns("history"),
    *_zone_columns("transient"),
    Column("tool_count", Integer, nullable=False),
    # JSON list of [server, state, tier, catalog_version, permitted_tool_count].
    Column("servers", Text, nullable=False),
    # JSON list of [sequence, handle, rule].
    Column("elided", Text, nullable=False),
    # The context guard's decision; NULL when none was taken.
    Column("context_guard", Text, nullable=True),
    # The last record the latest compaction covered (NULL: none, or written before it existed).
    Column("compacted_through", BigInteger, nullable=True),
    ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
    Index("ix_assembly_journal_run", "run_id", "create_time_us"),
    Index("ix_assembly_journal_time", "create_time_us"),
)

# Sentence vectors of tool texts for search, shared by every sidecar on the database: keyed by
# the encoder's identity (model, weights package, forward-pass revision) and a hash of the exact
# text encoded, so a listing one sidecar encoded is a read for the others and after a restart.
# Rows no catalogue version's text needs any more are collected (search/embeddings.py).
search_vectors = Table(
    "search_vectors",
    metadata,
    Column("encoder", String(128), primary_key=True),
    # BLAKE2b-128 of the text's UTF-8 bytes, hex.
    Column("text_hash", String(32), primary_key=True),
    # float32, little-endian, one unit-length row.
    Column("vector", LargeBinary, nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
)

# Tool calls that run as tasks on their MCP server (MCP tasks extension): one row per call,
# keyed like its tool result (Run, call id). `state` is a ToolTaskState name without its
# prefix; `next_poll_us` is when the task is next due a poll, and a sidecar that takes it
# moves it forward first (its claim: no lock is held while the server answers); `polls`
# counts the polls, for the backoff. `result_call_id` and `result_sequence` are set once the
# task's result is in the log.
tool_tasks = Table(
    "tool_tasks",
    metadata,
    Column("run_id", String(40), primary_key=True),
    Column("call_id", Text, primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("server", String(64), nullable=False),
    Column("tool", Text, nullable=False),
    Column("task_id", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("status_message", Text, nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
    Column("update_time_us", BigInteger, nullable=False),
    Column("next_poll_us", BigInteger, nullable=False),
    Column("polls", Integer, nullable=False),
    Column("poll_interval_ms", BigInteger, nullable=True),
    Column("result_call_id", Text, nullable=True),
    Column("result_sequence", BigInteger, nullable=True),
    Column("result_handle", Text, nullable=True),
    Index("ix_tool_tasks_due", "next_poll_us"),
)

# Tool calls whose MCP server asked for input (an elicitation) before it answered: one row a
# round, (run, the call's request id, round). The current wait is the newest round with no
# outcome; answering a round sets its outcome in one conditional UPDATE, so one answer wins
# whichever sidecar gets it. A stateless (2026-07-28) round holds what repeating the call
# needs (arguments, request state); a 2025-11-25 one names the call held in its session.
tool_input_rounds = Table(
    "tool_input_rounds",
    metadata,
    Column("run_id", String(40), primary_key=True),
    Column("request_id", String(128), primary_key=True),
    Column("round", Integer, primary_key=True, autoincrement=False),
    Column("call_id", Text, nullable=False),
    Column("server", Text, nullable=False),
    Column("tool", Text, nullable=False),
    # The opaque attempt the host echoes in ContinueToolCall.
    Column("attempt", String(64), nullable=False),
    Column("protocol_version", String(16), nullable=False),
    Column("arguments_json", Text, nullable=False),
    # JSON list of the server's requests, as sent (InputRequest.as_json).
    Column("requests_json", Text, nullable=False),
    # The server's opaque state (NULL: it sent none) and, on 2025-11-25, the held call.
    Column("request_state", Text, nullable=True),
    Column("held", String(64), nullable=False),
    Column("create_time_us", BigInteger, nullable=False),
    Column("expire_time_us", BigInteger, nullable=False),
    # Set when the round ends: "answered", "expired". NULL while it waits.
    Column("outcome", String(16), nullable=True),
    # JSON list of the answers (InputAnswer.as_json), when answered.
    Column("answers_json", Text, nullable=True),
    ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
)

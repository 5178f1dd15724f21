"""How large a tool call's arguments or result may be for a step of the call to run on the
event loop's thread, where it saves the hop to a worker thread and back (docs/design.md,
"Where a tool call's time goes"). Each limit weighs the work of one step against that hop, so
each has its own value; each is defined and explained here alone, and the module that applies
it imports it.

Not among them: the setting `prompt.inline_result_bytes` (config.py's `PromptSettings`,
docs/operations.md: 4 MiB by default), the largest result a tool-call response
(`CallDeferredTool`, `DispatchToolCall`) carries whole, wherever it is built; a larger one is
sent as an elided view naming its handle. It bounds what reaches the wire, not where work
runs, and the operator sets it.
"""

from __future__ import annotations

# Arguments of at most this many characters (strings, keys, one per scalar and per member;
# counted by a walk that stops once over, `calls.json_within`) are checked against the tool's
# input schema on the event loop when its validator is already built and runs no regular
# expression (whose time has no bound worth the loop's risk); others on the CPU threads
# (`calls/validation.py`).
MAX_ARGUMENT_CHARS_CHECKED_ON_LOOP = 4096

# An MCP result of at most this many characters (its texts and data, structured content and
# `_meta`, counted without converting it: `mcp/results.small_result`) is converted to log
# parts and judged against the tool's output schema on the event loop: the hop to a worker
# thread and back costs more than the work.
MAX_RESULT_CHARS_CONVERTED_ON_LOOP = 16 * 1024

# A result whose JSON is at most this many bytes is appended to the log by a step tried on
# the event loop first (`calls/ledger.py`; on SQLite, over the loop's connection that never
# waits); a larger one's outline and parts take a worker thread.
MAX_RESULT_BYTES_APPENDED_ON_LOOP = 16 * 1024

# A result whose JSON is at most this many bytes is put in its gRPC response on the event
# loop (`api/tools.py`); a larger one on the CPU threads, spliced into the response's bytes
# (`bulk/protobuf_splice.py`).
MAX_RESULT_BYTES_SERIALIZED_ON_LOOP = 256 * 1024

# The largest a tool call's arguments may be once the stored results they reference are put
# in (`calls/references.py`); the server passes the gRPC message limit (`max_message_bytes`),
# the largest arguments a host could have sent itself.
DEFAULT_MAX_ARGUMENT_BYTES = 64 * 1024 * 1024

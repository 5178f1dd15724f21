"""Latency workarounds for values of tens of MB: the same results as the plain calls, made in
pieces so that no single call holds the GIL (or faults in fresh memory) long enough to stall
the event loop. Nothing here is a rule of the sidecar; each helper says the measurement that
justifies it, and taking one out changes timings, never bytes.

- `slices`: a slice at a time with the GIL offered between — text encoding, a JSON value with
  long strings, base64 both ways, hex, counting UTF-8 characters;
- `protobuf_splice`: a large bytes field appended to a serialized message at the wire level;
- `heap`: glibc malloc keeping large freed blocks, and one left ready for a parse.

Storage's half, which speaks SQL and so stays in storage, is `psych_sidecar.storage.bulk_values`
(values over a MiB streamed into and out of their rows on SQLite and PostgreSQL).

This package imports nothing of the sidecar (an import contract): the domain may use its
slicing, the other layers any of it.
"""

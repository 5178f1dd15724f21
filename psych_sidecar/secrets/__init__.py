"""Secrets at rest: AES-256-GCM envelopes under the operator's keys.

- `cipher`: the key ring (several keys read, the first writes) and the envelope each stored
  secret becomes, bound to where it is stored;
- `key_files`: the keys' text form, key files, and the one the sidecar makes for itself beside
  a SQLite database.

Not SQL and no rule of the domain: storage seals and opens values at the row boundary, the
composition root loads the keys. This package imports nothing of the sidecar (an import
contract).
"""

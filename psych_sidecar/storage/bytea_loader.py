"""PostgreSQL's bytea values read a slice at a time: storage's half, for reads, of the latency
workarounds in `psych_sidecar.bulk` (`bulk_values` has the writes). Apart from them because it
subclasses psycopg's loader: psycopg (a tenth of a start's imports) is imported only by a
sidecar on PostgreSQL."""

from __future__ import annotations

import binascii

import psycopg
import psycopg.adapt
import psycopg.pq

from psych_sidecar.bulk.slices import sliced

# A bytea value arrives as text: "\x" and two hex digits a byte. psycopg's loader unescapes it
# in one call that holds the GIL: 103-118 ms for a 50 MB value (a retried call answered from
# the log, a large part listed). Hex longer than this is unescaped a slice at a time (~0.35 ms
# each), the GIL offered between: the worst pause reading a 50 MB value is now 13-15 ms.
_SLICED_HEX_BYTES = 1 << 20


class SlicedByteaLoader(psycopg.adapt.Loader):
    """psycopg's text bytea loader, a slice at a time for a large value in hex (the server's
    default `bytea_output`); anything else goes to libpq's unescaping as before. psycopg makes
    it with the default `sliced_hex_bytes`."""

    _escaping = psycopg.pq.Escaping()

    def __init__(
        self,
        oid: int,
        context: psycopg.abc.AdaptContext | None = None,
        *,
        sliced_hex_bytes: int = _SLICED_HEX_BYTES,
    ) -> None:
        super().__init__(oid, context)
        self._sliced_hex_bytes = sliced_hex_bytes

    def load(self, data: psycopg.abc.Buffer) -> bytes:
        view = memoryview(data)
        if len(view) <= self._sliced_hex_bytes or bytes(view[:2]) != b"\\x":
            # libpq's unescaping takes bytes; psycopg hands a loader a memoryview.
            return self._escaping.unescape_bytea(bytes(view))
        pieces = sliced(view[2:], self._sliced_hex_bytes)
        return b"".join(binascii.unhexlify(piece) for piece in pieces)

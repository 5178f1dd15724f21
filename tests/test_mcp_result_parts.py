"""MCP results as log parts: an image's base64, decoded in slices, stored as its bytes; data
that is not base64 kept as the server sent it."""

from __future__ import annotations

import base64

import mcp_types as types

from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.runlog import PartKind
from psych_sidecar.mcp import result_parts

# A whole number of 4-character groups, so that the image is decoded in many slices.
SLICE = 8


def test_a_long_image_is_stored_as_its_bytes_and_a_malformed_one_as_sent() -> None:
    raw = bytes(range(256)) * 3
    image = types.ImageContent(
        type="image", data=base64.b64encode(raw).decode(), mime_type="image/png"
    )
    part = result_parts.content_part(image, slice_chars=SLICE)
    assert (part.kind, part.data, part.mime_type) == (PartKind.BINARY, raw, "image/png")
    broken = types.ImageContent(type="image", data="QQ==" * 40, mime_type="image/png")
    part = result_parts.content_part(broken, slice_chars=SLICE)
    assert part.kind is PartKind.JSON
    assert part.data == canonical_json(result_parts._dump(broken))

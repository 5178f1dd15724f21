"""Property: whatever is appended, in whatever batches, reads back in order, byte for byte."""

from __future__ import annotations

import json
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psych.sidecar.v1 import content_pb2, run_pb2, run_service_pb2
from tests.support.requests import all_records, new_run
from tests.support.sidecar import Stubs

_parts = st.one_of(
    st.text(max_size=200).map(lambda text: content_pb2.ContentPart(text=text)),
    st.binary(max_size=200).map(
        lambda data: content_pb2.ContentPart(
            binary=content_pb2.BinaryContent(mime_type="application/octet-stream", data=data)
        )
    ),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=5,
    ).map(lambda value: content_pb2.ContentPart(json=json.dumps(value).encode())),
)
_identifiers = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=10
)
_records = st.one_of(
    st.lists(st.text(max_size=50), min_size=1, max_size=3).map(
        lambda texts: run_pb2.Record(
            user_message=run_pb2.UserMessage(
                content=[content_pb2.ContentPart(text=text) for text in texts]
            )
        )
    ),
    st.tuples(_identifiers, st.booleans(), st.lists(_parts, max_size=3)).map(
        lambda t: run_pb2.Record(
            tool_result=run_pb2.ToolResult(call_id=t[0], is_error=t[1], content=t[2])
        )
    ),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    batches=st.lists(st.lists(_records, min_size=1, max_size=4), min_size=1, max_size=5),
    page_size=st.integers(min_value=1, max_value=7),
)
def test_the_log_reads_back_exactly_what_was_appended(
    stubs: Stubs, unique: Callable[[str], str], batches: list[list[run_pb2.Record]], page_size: int
) -> None:
    run_id = new_run(stubs, unique("agent"))
    for batch in batches:
        stubs.runs.AppendRecords(run_service_pb2.AppendRecordsRequest(run_id=run_id, records=batch))
    sent = [record for batch in batches for record in batch]
    stored = all_records(stubs, run_id, page_size=page_size)
    assert [r.sequence for r in stored] == list(range(1, len(sent) + 1))
    for got, want in zip(stored, sent, strict=True):
        kind = want.WhichOneof("kind")
        assert kind is not None
        assert got.WhichOneof("kind") == kind
        assert getattr(got, kind) == getattr(want, kind)


def test_parts_over_a_mib_read_back_exactly(stubs: Stubs, unique: Callable[[str], str]) -> None:
    # These are streamed into their rows a MiB at a time (storage/bulk_values.py: an SQLite blob
    # handle, a PostgreSQL binary COPY);
    # multi-byte characters straddle the slice boundaries.
    run_id = new_run(stubs, unique("agent"))
    text = ("é😀x" * 700_000)[: 2 * 1024 * 1024 + 5]
    data = bytes(range(256)) * (5 * 4096 + 1)
    record = run_pb2.Record(
        tool_result=run_pb2.ToolResult(
            call_id="big",
            content=[
                content_pb2.ContentPart(text=text),
                content_pb2.ContentPart(text="small"),
                content_pb2.ContentPart(
                    binary=content_pb2.BinaryContent(mime_type="application/zip", data=data)
                ),
            ],
        )
    )
    stubs.runs.AppendRecords(run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[record]))
    (stored,) = all_records(stubs, run_id)
    assert stored.tool_result == record.tool_result

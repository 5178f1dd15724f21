"""ReadToolOutput over the real server on both databases: handles, offsets, grep, binary
content, and pages that stay under the message limit (1 MiB in this module)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import grpc

from psych.sidecar.v1 import content_pb2, tool_service_pb2
from tests.support.prompts import append, assemble, assistant, binary, read, result, run_with
from tests.support.requests import user
from tests.support.sidecar import Stubs, rpc_failure

MIB = 1024 * 1024
PAGE_BYTES = MIB - 64 * 1024


# The smallest message limit, so that results larger than a message stay small.
SIDECAR_OVERRIDES: dict[str, Any] = {"max_message_bytes": MIB}


def stored(stubs: Stubs, run_id: str, *parts: content_pb2.ContentPart | str) -> str:
    """Append one tool result and return its handle."""
    (appended,) = append(stubs, run_id, result("c", *parts))
    return appended.handle


def test_a_handle_that_does_not_resolve_is_a_typed_error(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    failure = rpc_failure(lambda: read(stubs, run_id, "h_doesnotexist"))
    assert failure.code == grpc.StatusCode.FAILED_PRECONDITION
    assert failure.info.reason == "INVALID_DEFERRED_HANDLE"
    assert dict(failure.info.metadata) == {"run_id": run_id, "handle": "h_doesnotexist"}


def test_a_handle_of_another_run_is_never_read(stubs: Stubs, unique: Callable[[str], str]) -> None:
    owner = run_with(stubs, unique("agent"), tenant="tenant-a")
    handle = stored(stubs, owner, "tenant a's secret")
    same_tenant = run_with(stubs, unique("agent"), tenant="tenant-a")
    other_tenant = run_with(stubs, unique("agent"), tenant="tenant-b")
    for reader in (same_tenant, other_tenant):
        failure = rpc_failure(partial(read, stubs, reader, handle))
        assert failure.code == grpc.StatusCode.FAILED_PRECONDITION
        assert failure.info.reason == "INVALID_DEFERRED_HANDLE"
        assert dict(failure.info.metadata) == {"run_id": reader, "handle": handle}
        assert "secret" not in failure.message
    assert read(stubs, owner, handle).text == "tenant a's secret"


def test_missing_or_bad_fields_are_refused(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    handle = stored(stubs, run_id, "text")
    cases = [
        (lambda: read(stubs, "run_missing", handle), "RUN_NOT_FOUND", None),
        (lambda: read(stubs, run_id, ""), "FIELD_REQUIRED", "handle"),
        (lambda: read(stubs, run_id, handle, offset=-1), "FIELD_INVALID", "offset"),
        (lambda: read(stubs, run_id, handle, limit=-5), "FIELD_INVALID", "limit"),
    ]
    for call, reason, field in cases:
        failure = rpc_failure(call)
        assert failure.info.reason == reason
        if field:
            assert failure.info.metadata["field"] == field


def test_offset_and_limit_count_characters(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    content = "αβγ🙂 plain ascii then ünïcødé " * 50
    handle = stored(stubs, run_id, content)
    whole = read(stubs, run_id, handle)
    assert (whole.text, whole.total_length, whole.next_offset) == (
        content,
        len(content),
        len(content),
    )
    assert (whole.data, whole.mime_type, list(whole.matches)) == (b"", "", [])
    for offset, limit in [(0, 1), (3, 2), (10, 100), (len(content) - 5, 100), (777, 0)]:
        got = read(stubs, run_id, handle, offset=offset, limit=limit)
        want = content[offset : offset + limit] if limit else content[offset:]
        assert got.text == want
        assert got.next_offset == offset + len(want)


def test_offset_past_the_end_is_an_empty_result(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    handle = stored(stubs, run_id, "twelve chars")
    for offset in (12, 13, 10**12):
        got = read(stubs, run_id, handle, offset=offset, limit=10)
        assert (got.text, got.total_length, got.next_offset) == ("", 12, 12)
        grepped = read(stubs, run_id, handle, offset=offset, grep=".")
        assert (list(grepped.matches), grepped.next_offset) == ([], 12)


def test_a_long_text_of_many_scripts_counts_and_reads_by_characters(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    # Over 256 KiB of UTF-8, the stored text's characters are counted slice by slice.
    run_id = run_with(stubs, unique("agent"))
    content = "abc é ✓ 中 😀\n" * 30_000
    assert 256 * 1024 < len(content.encode()) < 1024 * 1024 - 64 * 1024
    handle = stored(stubs, run_id, content)
    middle = len(content) // 2 + 3
    got = read(stubs, run_id, handle, offset=middle, limit=20)
    assert got.total_length == len(content)
    assert got.text == content[middle : middle + 20]


def test_grep_returns_matching_lines_with_numbers_and_character_offsets(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    lines = ["ünï INFO start", "ERROR disk full", "INFO ok", "error: lower", "ERROR again ✓"]
    content = "\n".join(lines) + "\n"
    handle = stored(stubs, run_id, content)
    got = read(stubs, run_id, handle, grep="ERROR")
    assert [(m.line_number, m.offset, m.line) for m in got.matches] == [
        (2, content.index("ERROR disk"), "ERROR disk full"),
        (5, content.index("ERROR again"), "ERROR again ✓"),
    ]
    assert got.text == "ERROR disk full\nERROR again ✓"
    assert got.next_offset == got.total_length == len(content)
    anchored = read(stubs, run_id, handle, grep="(?i)^error")
    assert [m.line_number for m in anchored.matches] == [2, 4, 5]
    # Matches never span lines, even when the pattern could.
    assert list(read(stubs, run_id, handle, grep=r"full\sINFO").matches) == []
    assert list(read(stubs, run_id, handle, grep=r"full[\s\S]*ok").matches) == []
    # From an offset, line numbers stay those of the whole text.
    later = read(stubs, run_id, handle, grep="ERROR|INFO", offset=content.index("INFO ok"))
    assert [m.line_number for m in later.matches] == [3, 5]
    limited = read(stubs, run_id, handle, grep="ERROR|INFO", limit=20)
    assert [m.line for m in limited.matches] == ["ünï INFO start"]
    assert limited.next_offset == content.index("ERROR disk")


def test_grep_with_no_match_is_an_empty_result(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    handle = stored(stubs, run_id, "alpha\nbeta\n")
    got = read(stubs, run_id, handle, grep="gamma")
    assert (got.text, list(got.matches), got.total_length, got.next_offset) == ("", [], 11, 11)


def test_grep_patterns_are_bounded_re2(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    handle = stored(stubs, run_id, "a" * 50_000 + "\n")
    for pattern, detail in [
        ("(unclosed", "missing )"),
        (r"(a)\1", "invalid escape"),
        ("(?=lookahead)", "invalid perl operator"),
        ("x" * 1025, "longer than 1024 characters"),
    ]:
        failure = rpc_failure(partial(read, stubs, run_id, handle, grep=pattern))
        assert failure.code == grpc.StatusCode.INVALID_ARGUMENT
        assert failure.info.reason == "PATTERN_INVALID"
        assert failure.info.metadata["field"] == "grep"
        assert detail in failure.info.metadata["detail"]
    # The error quotes the pattern as given, not with the flags the reader adds to it.
    failure = rpc_failure(lambda: read(stubs, run_id, handle, grep="("))
    assert failure.info.metadata["detail"] == "missing ): ("
    assert failure.message == "grep: not a valid RE2 pattern: missing ): ("
    # A pattern that backtracking engines take exponential time on is linear on RE2.
    assert list(read(stubs, run_id, handle, grep="(a*)*b").matches) == []
    assert len(read(stubs, run_id, handle, grep="(a|aa)*$").matches) == 1


def test_binary_content_is_read_in_bytes_and_never_grepped(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    data = bytes(range(256)) * 40 + b"ERROR\n"
    handle = stored(stubs, run_id, binary("application/octet-stream", data))
    whole = read(stubs, run_id, handle)
    assert (whole.data, whole.text, whole.mime_type) == (data, "", "application/octet-stream")
    assert (whole.total_length, whole.next_offset) == (len(data), len(data))
    part = read(stubs, run_id, handle, offset=250, limit=10)
    assert (part.data, part.next_offset) == (data[250:260], 260)
    past = read(stubs, run_id, handle, offset=len(data) + 1)
    assert (past.data, past.next_offset) == (b"", len(data))
    grepped = read(stubs, run_id, handle, grep="ERROR")
    assert (grepped.data, grepped.text, list(grepped.matches)) == (b"", "", [])
    assert (grepped.mime_type, grepped.total_length, grepped.next_offset) == (
        "application/octet-stream",
        len(data),
        len(data),
    )


def test_binary_parts_of_a_mixed_result_read_as_markers(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    handle = stored(
        stubs,
        run_id,
        "caption",
        binary("image/png", b"\x89PNG\r\n\x1a\n"),
        content_pb2.ContentPart(json=b'{"a": 1}'),
    )
    got = read(stubs, run_id, handle)
    assert got.text == 'caption\n[binary content: image/png, 8 bytes]\n{"a": 1}'
    assert (got.data, got.mime_type) == (b"", "")
    assert [m.line for m in read(stubs, run_id, handle, grep="image/png").matches] == [
        "[binary content: image/png, 8 bytes]"
    ]


def test_a_result_larger_than_a_message_is_paged(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    content = "".join(f"{i:07d} payload ÿ\n" for i in range(52_000))  # 988,000 bytes
    assert PAGE_BYTES < len(content.encode()) < MIB
    handle = stored(stubs, run_id, content)
    pages, offset = [], 0
    while offset < len(content):
        page = read(stubs, run_id, handle, offset=offset)
        assert page.ByteSize() <= MIB
        assert page.next_offset > offset
        pages.append(page.text)
        offset = page.next_offset
    assert len(pages) == 2
    assert "".join(pages) == content

    matches: list[tool_service_pb2.GrepMatch] = []
    offset = 0
    while offset < len(content):
        page = read(stubs, run_id, handle, offset=offset, grep="payload")
        assert page.ByteSize() <= MIB
        matches.extend(page.matches)
        offset = page.next_offset
    assert [m.line_number for m in matches] == list(range(1, 52_001))
    assert all(m.line == f"{i:07d} payload ÿ" for i, m in enumerate(matches))


def test_a_binary_result_larger_than_a_message_is_paged(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    data = bytes(range(251)) * 4000  # ~0.96 MiB
    handle = stored(stubs, run_id, binary("application/zip", data))
    first = read(stubs, run_id, handle)
    assert len(first.data) == first.next_offset == PAGE_BYTES
    second = read(stubs, run_id, handle, offset=first.next_offset)
    assert first.data + second.data == data
    assert second.next_offset == len(data)


def test_a_prompt_larger_than_a_message_is_refused_with_error_info(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    run_id = run_with(stubs, unique("agent"))
    append(stubs, run_id, user("go"), assistant("", ("c", "t", "{}")), result("c", "z" * 600_000))
    failure = rpc_failure(lambda: assemble(stubs, run_id))
    assert failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert failure.info.reason == "MESSAGE_TOO_LARGE"
    assert failure.info.metadata["limit_bytes"] == str(MIB)
    assert int(failure.info.metadata["size_bytes"]) > MIB


def test_json_parts_must_be_utf8_to_be_stored(stubs: Stubs, unique: Callable[[str], str]) -> None:
    run_id = run_with(stubs, unique("agent"))
    utf16 = '{"a": "ü"}'.encode("utf-16")
    failure = rpc_failure(lambda: stored(stubs, run_id, content_pb2.ContentPart(json=utf16)))
    assert failure.info.reason == "FIELD_INVALID"
    assert failure.info.metadata["field"] == "records[0].tool_result.content[0].json"

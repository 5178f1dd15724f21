"""read_history: the model reads and greps the records a compaction summarised, in-process over
the log (docs/prompt.md, "Compaction"). Nothing a compaction covers is lost: the summary's
framing names this tool, and read_tool_output still reads any tool result by its handle.

The span is the records up to the end of the latest compaction's range. A read selects a turn
(`turn`) or the records from a sequence on (`sequence`), the whole span by default, and
renders each record as a header line and its text: a user message and an assistant message in
full (each text part up to `RECORD_PART_CHARS`), an assistant's tool calls one line each, a
tool result as its handle, size and first `RESULT_HEAD_CHARS` characters (read_tool_output
reads the rest). Pages are whole records, at most `limit` characters, and say where to go on.

The boundary rules are read_tool_output's: past the end of the span (or no compaction yet)
and a grep with no match give an empty result; a bad selection (both, or below 1) is a tool
error. A grep is RE2 (tool_output.compile_pattern, its bounds), line by line over the
rendering, and its scan stops after `GREP_CPU_BUDGET_SECONDS` of CPU or `MAX_SCAN_RECORDS`
records, saying where to continue.

A read costs what it shows, not the Run's length: the latest compaction is found by an indexed
MAX, a turn's first record by its rank among the user messages, a sequence's turn by an
indexed count (each one row back), and the records are fetched in batches (growing from
`_FIRST_BATCH` to `_BATCH`) from where the selection starts, only as far as the page (or the
grep's bounds) goes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from psych_sidecar.domain.calls.tool_output import GREP_CPU_BUDGET_SECONDS, compile_pattern
from psych_sidecar.domain.runlog import (
    ContentPart,
    LogReader,
    PartKind,
    RecordKind,
    RecordSkeleton,
    TextLayout,
    binary_marker,
    fetch_text,
    model_view,
    split_compaction,
)

RESULT_HEAD_CHARS = 300
RECORD_PART_CHARS = 20_000
MAX_SCAN_RECORDS = 5_000
# Records loaded from the log at once: a first batch of `_FIRST_BATCH`, each next one twice
# as large up to `_BATCH`, so a short page loads little more than it shows.
_FIRST_BATCH = 8
_BATCH = 64


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """What one read found: the text (empty: nothing there) and the sequence to continue
    from (0: the span is done)."""

    text: str
    next_sequence: int
    span_end: int


class HistoryReader:
    def __init__(self, log: LogReader) -> None:
        self._log = log

    def read(
        self,
        run_id: str,
        *,
        turn: int | None,
        sequence: int | None,
        grep: str,
        limit: int,
    ) -> HistoryPage:
        """One page. `turn` and `sequence` are checked by the caller (at most one, >= 1); a
        bad grep pattern raises PATTERN_INVALID / PATTERN_TOO_COMPLEX."""
        pattern = compile_pattern(grep, "grep") if grep else None
        latest = self._log.latest_compaction_sequence(run_id)
        if not latest:
            return HistoryPage("", 0, 0)
        content = self._log.record_contents(run_id, [latest])[latest]
        end = split_compaction(content)[1].last_sequence
        # Where the selection starts and ends, found by indexed lookups that return a row or
        # two: a read fetches the records it shows, not the Run's.
        if turn is not None:
            starts = self._log.turn_starts(run_id, turn, 2)
            if not starts or starts[0] > end:
                return HistoryPage("", 0, end)
            first, last = starts[0], min(end, starts[1] - 1) if len(starts) > 1 else end
            before = turn - 1
        else:
            first, last = sequence or 1, end
            if first > end:
                return HistoryPage("", 0, end)
            before = self._log.turn_of(run_id, first - 1)
        selected = self._selected(run_id, first, last, before)
        if pattern is None:
            return self._page(run_id, selected, limit, end)
        return self._grep(run_id, selected, pattern, limit, end)

    def _selected(
        self, run_id: str, first: int, last: int, before: int
    ) -> Iterator[list[tuple[RecordSkeleton, int]]]:
        """The records `first` to `last` but compactions, each with its turn (`before` is the
        turn of the record before `first`), a batch at a time as the reader asks for them."""
        number = before
        size = _FIRST_BATCH
        while first <= last:
            batch = self._log.record_skeletons_between(run_id, first, last, size)
            size = min(2 * size, _BATCH)
            if not batch:
                return
            shown = []
            for skeleton in batch:
                if skeleton.kind is RecordKind.USER_MESSAGE:
                    number += 1
                if skeleton.kind is not RecordKind.COMPACTION:
                    shown.append((skeleton, number))
            if shown:
                yield shown
            first = batch[-1].sequence + 1

    def _page(
        self,
        run_id: str,
        selected: Iterator[list[tuple[RecordSkeleton, int]]],
        limit: int,
        end: int,
    ) -> HistoryPage:
        blocks: list[str] = []
        used = 0
        for skeleton, _, block in self._rendered(run_id, selected):
            if blocks and used + len(block) > limit:
                return HistoryPage("\n\n".join(blocks), skeleton.sequence, end)
            if not blocks and len(block) > limit:
                block = block[:limit] + "\n[This record is cut at the page's limit.]"
            blocks.append(block)
            used += len(block) + 2
        return HistoryPage("\n\n".join(blocks), 0, end)

    def _grep(
        self,
        run_id: str,
        selected: Iterator[list[tuple[RecordSkeleton, int]]],
        pattern: Any,
        limit: int,
        end: int,
    ) -> HistoryPage:
        began = time.thread_time()
        lines: list[str] = []
        used = 0
        for scanned, (skeleton, turn, block) in enumerate(self._rendered(run_id, selected)):
            over_time = time.thread_time() - began > GREP_CPU_BUDGET_SECONDS
            if scanned >= MAX_SCAN_RECORDS or over_time:
                return HistoryPage("\n".join(lines), skeleton.sequence, end)
            found = []
            for line in block.split("\n")[1:]:
                if pattern.search(line.encode()) is not None:
                    found.append(f"#{skeleton.sequence} (turn {turn}): {line}")
            size = sum(len(line) + 1 for line in found)
            if lines and used + size > limit:
                return HistoryPage("\n".join(lines), skeleton.sequence, end)
            lines.extend(found)
            used += size
        return HistoryPage("\n".join(lines)[: max(limit, 1)] if lines else "", 0, end)

    def _rendered(
        self, run_id: str, selected: Iterator[list[tuple[RecordSkeleton, int]]]
    ) -> Iterator[tuple[RecordSkeleton, int, str]]:
        """Each selected record, its turn and its rendering, its content loaded a batch at a
        time."""
        for batch in selected:
            messages = [s.sequence for s, _ in batch if s.kind is not RecordKind.TOOL_RESULT]
            contents = self._log.record_contents(run_id, messages) if messages else {}
            heads = self._result_heads(
                run_id, [s for s, _ in batch if s.kind is RecordKind.TOOL_RESULT]
            )
            for skeleton, turn in batch:
                content = contents.get(skeleton.sequence, ())
                yield skeleton, turn, _render(skeleton, turn, content, heads.get(skeleton.sequence))

    def _result_heads(
        self, run_id: str, results: Sequence[RecordSkeleton]
    ) -> dict[int, tuple[str, int]]:
        """Each result's first characters and its length in characters."""
        if not results:
            return {}
        metas = self._log.part_metas(run_id, [s.sequence for s in results])
        layouts = {s.sequence: TextLayout(model_view(metas.get(s.sequence, []))) for s in results}
        requests = [
            (sequence, layout.pieces(0, RESULT_HEAD_CHARS)) for sequence, layout in layouts.items()
        ]
        texts = fetch_text(self._log, run_id, requests)
        return {
            sequence: (text, layouts[sequence].total_chars)
            for (sequence, _), text in zip(requests, texts, strict=True)
        }


def _text(parts: Sequence[ContentPart]) -> list[str]:
    lines = []
    for part in parts:
        if part.kind is PartKind.BINARY:
            lines.append(binary_marker(part.mime_type, len(part.data)))
        elif part.kind in (PartKind.TEXT, PartKind.JSON):
            text = part.as_text()
            if len(text) > RECORD_PART_CHARS:
                more = len(text) - RECORD_PART_CHARS
                text = text[:RECORD_PART_CHARS] + f"\n[... {more} more characters]"
            lines.append(text)
    return lines


def _render(
    skeleton: RecordSkeleton,
    turn: int,
    content: Sequence[ContentPart],
    head: tuple[str, int] | None,
) -> str:
    where = f"#{skeleton.sequence} · turn {turn}"
    if skeleton.kind is RecordKind.USER_MESSAGE:
        return "\n".join([f"[{where} · user]", *_text(content)])
    if skeleton.kind is RecordKind.ASSISTANT_MESSAGE:
        calls = [
            f"tool call {call.name} {call.arguments_json or '{}'} (call {call.call_id})"
            for call in skeleton.tool_calls
        ]
        return "\n".join([f"[{where} · assistant]", *_text(content), *calls])
    text, total = head or ("", 0)
    status = "failed " if skeleton.is_error else ""
    header = (
        f"[{where} · {status}tool result of call {skeleton.call_id} · {total} characters · "
        f'read_tool_output(handle="{skeleton.handle}") reads it all]'
    )
    if total > len(text):
        text += " …"
    return f"{header}\n{text}"

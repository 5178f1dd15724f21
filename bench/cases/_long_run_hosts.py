"""What the 1,000-turn trace of long_run.py costs in billed input, for three hosts fed by the
one replay (`LongRunBills`):

- **sidecar**: the host of long_run.py: every call sends AssemblePrompt's Anthropic body, and
  every compaction the sidecar proposes is one summary call (the proposal's Anthropic body,
  which reads the cached prefix of the call it stands for);
- **compacting**: the best practice a strong team builds without the sidecar, as
  billed_input.py's best-practice host (provider-side tool search: only the search tool is
  sent, `run_query`'s definition billed once where a search brings it in; every result
  capped at 25,000 tokens with a note; the clock in a final block; breakpoints on the tools,
  the system prompt and the last two messages), plus Anthropic's server-side compaction at
  its default trigger: when a request reaches 150,000 tokens, a summary call (that very
  request with the summary instruction in place of its clock, so it reads the same cached
  prefix) and then the conversation is the summary alone, as after the provider's
  compaction block: the compacted span is lost to the model;
- **ideal**: the sidecar's own bodies and summary calls under a perfect cache (billed_input's
  ideal): every byte written once at 1.25x and read at 0.1x by every later call that starts
  with it. It sends exactly what the model sees in the sidecar's view, no byte more, each
  byte at the lowest price its place allows.

All three are billed by the cache simulation of billed_input.py (`CacheSimulation`), by block
kind (`long_run_kinds`), a summary call's whole bill under `summary_calls`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from bench.cases.billed_input import (
    RESULT_CAP_TOKENS,
    CacheSimulation,
    Conversation,
    _capped,
)

# Anthropic's output price over its input price (a summary is output).
OUTPUT_PRICE = 5
# Anthropic's default trigger for its server-side compaction (`compact_20260112`).
COMPACTING_TRIGGER_TOKENS = 150_000
RUN_QUERY = {
    "name": "run_query",
    "description": "Run a query against the service's log store; returns the matching lines.",
    "input_schema": {
        "type": "object",
        "properties": {"q": {"type": "integer", "description": "The query's number."}},
        "required": ["q"],
    },
}
SUMMARY_REQUEST = (
    "You have written a partial transcript for the initial task above. Write a summary of the "
    "transcript so far, to continue the task from it in a new context window: the user's "
    "goals and constraints, decisions made and why, facts learned (names, numbers, "
    "identifiers), work done and work still open. Wrap it in <summary></summary> tags."
)
SUMMARY_PREFIX = "[Summary of "
SEARCH_LOADED = "[tool search loaded]"


def long_run_kinds(body: bytes) -> list[str]:
    """The kind of each cache block of a long-run Anthropic body (cache order): `tools`,
    `system`, `summary` (a compaction's summary), `user`, `assistant`, `tool_definitions_loaded`
    (what a tool search brought in), `current_turn_results` and `prior_turn_results` (in full,
    or capped), `previews` (results the sidecar elided to a preview and a handle) and
    `trailing_block` (the clock, the transient note or a summary request)."""
    parsed = json.loads(body)
    kinds = ["tools"] * len(parsed.get("tools", [])) + ["system"] * len(parsed.get("system", []))
    blocks = [(m["role"], b) for m in parsed["messages"] for b in m["content"]]
    questions = [
        i
        for i, (role, b) in enumerate(blocks)
        if role == "user" and b["type"] == "text" and b["text"].startswith("Turn ")
    ]
    start = questions[-1] if questions else 0
    for index, (role, block) in enumerate(blocks):
        if block["type"] == "tool_result":
            shown = json.dumps(block.get("content", ""), ensure_ascii=False)
            if "[Elided from this prompt" in shown:
                kinds.append("previews")
            else:
                kinds.append("current_turn_results" if index >= start else "prior_turn_results")
        elif block["type"] == "text" and block["text"].startswith(SUMMARY_PREFIX):
            kinds.append("summary")
        elif block["type"] == "text" and block["text"].startswith(SEARCH_LOADED):
            kinds.append("tool_definitions_loaded")
        else:
            kinds.append(role)
    kinds[-1] = "trailing_block"
    return kinds


@dataclass
class LongRunBill(CacheSimulation):
    """A host's bill over the long-run trace: its calls, and its summary calls billed whole
    under `summary_calls`."""

    summary_calls: int = 0

    def kinds(self, body: bytes) -> list[str]:
        return long_run_kinds(body)

    def summary_call(self, body: bytes) -> dict[str, int]:
        before = dict(self.billed_by_kind)
        before_input = dict(self.input_by_kind)
        figures = self.request(body)
        for kinds, earlier in ((self.billed_by_kind, before), (self.input_by_kind, before_input)):
            added = sum(kinds.values()) - sum(earlier.values())
            kinds.clear()
            kinds.update(earlier)
            kinds["summary_calls"] = kinds.get("summary_calls", 0.0) + added
        self.summary_calls += 1
        return figures

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "summary_calls": self.summary_calls}


@dataclass
class CompactingHost:
    """The conversation of the best-practice host that compacts as Anthropic does (see the
    module's docstring), and its bill."""

    system: str = ""
    summary_chars: int = 6_000
    bill: LongRunBill = field(default_factory=LongRunBill)
    conversation: Conversation = field(default_factory=lambda: Conversation(best_practice=True))
    run_query_loaded: bool = False
    compactions: int = 0
    results_capped: int = 0
    calls: int = 0

    def user(self, text: str) -> None:
        self.conversation.user(text)

    def answer(self, text: str) -> None:
        self.conversation.messages.append(
            {"role": "assistant", "content": [{"type": "text", "text": text}]}
        )

    def tool_step(self, call_id: str, result_text: str) -> None:
        content: list[dict[str, Any]] = []
        if not self.run_query_loaded:
            # The search's result: run_query's definition, billed here once (again after a
            # compaction, which drops it with the rest).
            content.append({"type": "text", "text": f"{SEARCH_LOADED} {json.dumps([RUN_QUERY])}"})
            self.run_query_loaded = True
        content.append({"type": "tool_use", "id": call_id, "name": "run_query", "input": {"q": 1}})
        shown = _capped([{"type": "text", "text": result_text}])
        self.results_capped += len(shown) > 1
        self.conversation.messages += [
            {"role": "assistant", "content": content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call_id, "content": shown}],
            },
        ]

    def call(self) -> None:
        """One model call: a compaction first when the request reaches the trigger."""
        body = self.conversation.body([], self.system, self.calls, True)
        if -(-len(body) // 4) >= COMPACTING_TRIGGER_TOKENS:
            self.bill.summary_call(self._summary_call(body))
            self.compactions += 1
            summary = words(self.summary_chars, random.Random(self.compactions))
            self.conversation.messages = [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": f"{SUMMARY_PREFIX}the conversation]\n\n{summary}"}
                    ],
                }
            ]
            self.run_query_loaded = False
            body = self.conversation.body([], self.system, self.calls, True)
        self.bill.request(body)
        self.calls += 1

    @staticmethod
    def _summary_call(body: bytes) -> bytes:
        """The request that reached the trigger, its clock replaced by the summary request:
        the same prefix, read from the cache."""
        parsed = json.loads(body)
        parsed["messages"][-1]["content"][-1] = {"type": "text", "text": SUMMARY_REQUEST}
        return json.dumps(parsed, ensure_ascii=False, separators=(",", ":")).encode()


def words(size: int, rng: random.Random) -> str:
    words = ("alpha", "queue", "retry", "shard", "deploy", "budget", "prompt", "cache")
    return " ".join(rng.choice(words) for _ in range(size // 6 + 1))[:size]


@dataclass
class LongRunBills:
    """The three hosts' bills over one replay of the trace."""

    sidecar: LongRunBill = field(default_factory=LongRunBill)
    ideal: LongRunBill = field(default_factory=lambda: LongRunBill(perfect=True))
    compacting: CompactingHost = field(default_factory=CompactingHost)

    def sidecar_summary_call(self, body: bytes) -> None:
        self.sidecar.summary_call(body)
        self.ideal.summary_call(body)

    def sidecar_call(self, body: bytes) -> None:
        self.sidecar.request(body)
        self.ideal.request(body)

    def figures(self) -> dict[str, Any]:
        # The summaries are output, not input: each host's, in tokens, and the ratio with them
        # billed at the output price (both hosts' summaries are the same size).
        summary_tokens = self.compacting.summary_chars // 4
        sidecar_output = self.sidecar.summary_calls * summary_tokens
        compacting_output = self.compacting.bill.summary_calls * summary_tokens
        hosts = {
            "sidecar": {**self.sidecar.summary(), "summary_output_tokens": sidecar_output},
            "compacting_host": {
                **self.compacting.bill.summary(),
                "summary_output_tokens": compacting_output,
                "compactions": self.compacting.compactions,
                "results_capped": self.compacting.results_capped,
            },
            "ideal": self.ideal.summary(),
        }
        return {
            "ratios": {
                "compacting_host_over_sidecar": round(
                    self.compacting.bill.billed / self.sidecar.billed, 3
                ),
                "compacting_host_over_sidecar_with_summary_output": round(
                    (self.compacting.bill.billed + OUTPUT_PRICE * compacting_output)
                    / (self.sidecar.billed + OUTPUT_PRICE * sidecar_output),
                    3,
                ),
                "sidecar_over_ideal": round(self.sidecar.billed / self.ideal.billed, 3),
            },
            "result_cap_tokens": RESULT_CAP_TOKENS,
            "compacting_trigger_tokens": COMPACTING_TRIGGER_TOKENS,
            **hosts,
        }

    def table(self) -> list[str]:
        """The bill by kind, one line a kind, a column a host (billed-input equivalent)."""
        bills = {
            "sidecar": self.sidecar.billed_by_kind,
            "compacting": self.compacting.bill.billed_by_kind,
            "ideal": self.ideal.billed_by_kind,
        }
        kinds = sorted({kind for bill in bills.values() for kind in bill})
        lines = [f"{'billed by kind':26}" + "".join(f"{name:>14}" for name in bills)]
        for kind in [*kinds, "total"]:
            cells = [
                sum(bill.values()) if kind == "total" else bill.get(kind, 0.0)
                for bill in bills.values()
            ]
            lines.append(f"{kind:26}" + "".join(f"{round(cell):>14,}" for cell in cells))
        return lines

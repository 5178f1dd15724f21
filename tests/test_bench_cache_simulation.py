"""The billed-input benchmark's simulation of Anthropic's prompt cache, on bodies built by
hand (pure: no server): its sizes are the body's own bytes, so no call reads and writes more
than it sends."""

from __future__ import annotations

import itertools
from typing import Any

from bench.cases.billed_input import CacheSimulation, Conversation

# Schemas with many keys: a re-encoding with spaces or extra keys would come out larger.
TOOLS = [
    {
        "name": f"tool_{index}",
        "description": "Does one thing.",
        "input_schema": {
            "type": "object",
            "properties": {f"field_{n}": {"type": "string"} for n in range(20)},
        },
    }
    for index in range(30)
]


def conversation_bodies(conversation: Conversation, calls: int) -> list[bytes]:
    bodies = []
    conversation.user("Where are the failures?")
    for call in range(calls):
        bodies.append(conversation.body(TOOLS, "Answer from the logs. " * 200, call, True))
        result: dict[str, Any] = {"content": [{"type": "text", "text": "ünïcode line\n" * 300}]}
        thinking = {"type": "thinking", "thinking": f"Step {call}.", "signature": "c2ln"}
        conversation.step(thinking, "Looking.", [(f"call_{call}", "tool_1", {"q": call}, result)])
    return bodies


def test_reads_and_writes_never_exceed_the_request_and_end_where_its_blocks_end() -> None:
    simulation = CacheSimulation()
    for body in conversation_bodies(Conversation(), 4):
        figures = simulation.request(body)
        assert figures["read"] + figures["write"] <= figures["tokens"]
    # Each later call reads the previous call's prefix: nearly all of what it sends.
    assert all(call["read"] > 0.8 * call["tokens"] for call in simulation.per_call[1:])
    assert simulation.summary()["share_of_input_from_cache"] <= 1


def test_the_perfect_cache_reads_what_any_earlier_call_sent_and_bills_no_more() -> None:
    bodies = conversation_bodies(Conversation(best_practice=True), 4)
    perfect, real = CacheSimulation(perfect=True), CacheSimulation()
    figures = [(perfect.request(body), real.request(body)) for body in bodies]
    assert figures[0][0]["read"] == 0
    for floor, actual in figures:
        assert floor["read"] + floor["write"] <= floor["tokens"]
        assert floor["read"] >= actual["read"]
        assert floor["billed"] <= actual["billed"]
    # What one call wrote, the next reads (less the two breakpoint markers that moved on: their
    # bytes are no content).
    marker = len(b',"cache_control":{"type":"ephemeral"}') // 4 + 1
    for before, after in itertools.pairwise(figures):
        assert after[0]["read"] >= before[0]["read"] + before[0]["write"] - 2 * marker

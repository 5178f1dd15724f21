"""The provider-neutral prompt, its four cache zones, and their canonical JSON.

Zones, outermost-stable first:

1. static system: the tool surface (pinned per turn), then the Spec's sections
   (instructions, skills index, subagent roster, capability notes): nothing per tenant;
2. the dynamic tail: the turn's tool-server roster, then what the host supplies (memories
   and the like), last in the system prompt;
3. the history, prior-turn tool results elided;
4. one transient message: the date and time, the state of servers not connected right now,
   the calls waiting for their user's input, and any per-call note; never persisted.

The clock only ever reaches zone 4. Canonical JSON here means: keys in the order this module
writes them (documented in docs/prompt.md), no whitespace, UTF-8, non-ASCII unescaped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from typing import Any

from psych_sidecar.bulk.slices import b64encode_sliced
from psych_sidecar.domain.canonical import canonical_json
from psych_sidecar.domain.catalog import InputMode, InputWait
from psych_sidecar.domain.prompt.provider_compaction import ProviderCompaction
from psych_sidecar.domain.runlog import (
    ContentPart,
    PartKind,
    ProgrammaticCalling,
    RecordKind,
    Spec,
    ToolCall,
)
from psych_sidecar.domain.surface import ExposedTool, ServerLine, ToolSurface

MISSING_RESULT_TEXT = "No result was recorded for this tool call."


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"


class Zone(IntEnum):
    STATIC_SYSTEM = 1
    DYNAMIC_TAIL = 2
    HISTORY = 3
    TRANSIENT = 4


@dataclass(frozen=True, slots=True)
class ToolResultView:
    """A tool result as the model sees it this call."""

    call_id: str
    is_error: bool
    content: tuple[ContentPart, ...]
    elided: bool
    handle: str


PromptPart = ContentPart | ToolCall | ToolResultView


@dataclass(frozen=True, slots=True)
class PromptMessage:
    role: Role
    parts: tuple[PromptPart, ...]

    @property
    def is_tool_results(self) -> bool:
        return bool(self.parts) and all(isinstance(p, ToolResultView) for p in self.parts)


@dataclass(frozen=True, slots=True)
class SystemSection:
    title: str
    text: str


@dataclass(frozen=True, slots=True)
class Prompt:
    static_sections: tuple[SystemSection, ...]
    dynamic_tail: str
    history: tuple[PromptMessage, ...]
    transient: PromptMessage
    # The turn's tool surface: the tools sent, and the server lines behind the Tool servers
    # roster of zone 2.
    surface: ToolSurface
    # Who may call those tools: the Spec's programmatic calling (the Anthropic and OpenAI
    # Responses bodies' allowed_callers and sandbox tool).
    programmatic_calling: ProgrammaticCalling = field(default_factory=ProgrammaticCalling)
    # The provider's own compaction the Anthropic and OpenAI Responses bodies ask for (None:
    # they ask for none; provider_compaction.py).
    provider_compaction: ProviderCompaction | None = None

    @property
    def tools(self) -> tuple[ExposedTool, ...]:
        return self.surface.tools

    def static_text(self) -> str:
        """Zone 1's sections as one system text: each a Markdown heading and its text."""
        return "\n\n".join(f"# {s.title}\n\n{s.text}" for s in self.static_sections)


@dataclass(frozen=True, slots=True)
class ZoneDigest:
    zone: Zone
    byte_length: int
    sha256: str


def _entry(name: str, description: str) -> str:
    return f"- {name}: {description}" if description else f"- {name}"


def static_sections(spec: Spec) -> tuple[SystemSection, ...]:
    """Zone 1: from the Spec alone, instructions, the skills index (names and descriptions;
    bodies load through load_skill), the subagent roster, capability notes. Empty sections
    are left out. Nothing per tenant: zone 1 changes only when the Spec does."""
    sections = []
    if spec.instructions:
        sections.append(SystemSection("Instructions", spec.instructions))
    if spec.skills:
        lines = [_entry(skill.name, skill.description) for skill in spec.skills]
        lines.append("")
        lines.append("Load a skill's full text with the load_skill tool before following it.")
        sections.append(SystemSection("Skills", "\n".join(lines)))
    if spec.subagents:
        lines = [_entry(agent.name, agent.description) for agent in spec.subagents]
        sections.append(SystemSection("Subagents", "\n".join(lines)))
    if spec.capability_notes:
        sections.append(SystemSection("Capabilities", "\n\n".join(spec.capability_notes)))
    return tuple(sections)


def dynamic_tail(servers: Sequence[ServerLine], host_tail: str) -> str:
    """Zone 2: the tool-server roster of the turn (one line per MCP server the Run can see,
    so a deferred server is never silently absent), then the host's tail (memories and the
    like). Per-tenant and mutable mid-conversation, so it sits last in the system prompt;
    connection states are not in it (see `transient_message`)."""
    parts = []
    if servers:
        parts.append("# Tool servers\n\n" + "\n".join(line.text for line in servers))
    if host_tail:
        parts.append(host_tail)
    return "\n\n".join(parts)


# The longest line telling the model of one call waiting for its user's input.
MAX_WAITING_LINE_CHARS = 199


def waiting_note(waits: Sequence[InputWait]) -> str:
    """One line per call waiting for its user's input (under 200 characters each): which
    call, and what its server asked. Zone 4: it changes as calls are answered."""
    lines = []
    for wait in waits:
        request = wait.asked.requests[0] if wait.asked.requests else None
        what = "a URL to open" if request and request.mode is InputMode.URL else "input"
        line = (
            f"Tool call {wait.call_id} ({wait.server}/{wait.tool}) waits for the user's "
            f"{what}: {' '.join((request.message if request else '').split())}"
        )
        if len(line) > MAX_WAITING_LINE_CHARS:
            line = line[: MAX_WAITING_LINE_CHARS - 1] + "…"
        lines.append(line)
    return "\n".join(lines)


def transient_message(now: datetime, note: str, status: str = "") -> PromptMessage:
    """Zone 4: the current date and time (UTC, to the second), the state of any tool server
    that is not connected right now, and the host's note."""
    moment = now.astimezone(UTC).replace(microsecond=0)
    text = f"Current date and time: {moment.strftime('%A, %Y-%m-%dT%H:%M:%SZ')}"
    if status:
        text += "\n\n" + status
    if note:
        text += "\n\n" + note
    return PromptMessage(Role.USER, (ContentPart.text(text),))


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One record, ready for the history: its content loaded, or its result's view."""

    kind: RecordKind
    content: tuple[ContentPart, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    result: ToolResultView | None = None


def build_history(entries: Sequence[HistoryEntry]) -> tuple[PromptMessage, ...]:
    """Records to messages: a user message each, an assistant message each (its text, then
    its tool calls), and each run of tool results as one user-role message.

    Every tool call gets a result before the conversation moves on: a call the log holds no
    result for, by the next user or assistant message (or the end), is answered with an
    error result saying so, so that a provider accepts the request."""
    messages: list[PromptMessage] = []
    pending: list[str] = []  # call ids of the last assistant message still unanswered

    def close_calls() -> None:
        if not pending:
            return
        missing = tuple(
            ToolResultView(call_id, True, (ContentPart.text(MISSING_RESULT_TEXT),), False, "")
            for call_id in pending
        )
        if messages and messages[-1].is_tool_results:
            last = messages.pop()
            messages.append(PromptMessage(Role.USER, last.parts + missing))
        else:
            messages.append(PromptMessage(Role.USER, missing))
        pending.clear()

    for entry in entries:
        if entry.kind is RecordKind.TOOL_RESULT:
            assert entry.result is not None
            if entry.result.call_id in pending:
                pending.remove(entry.result.call_id)
            if messages and messages[-1].is_tool_results:
                last = messages.pop()
                messages.append(PromptMessage(Role.USER, (*last.parts, entry.result)))
            else:
                messages.append(PromptMessage(Role.USER, (entry.result,)))
            continue
        close_calls()
        if entry.kind is RecordKind.USER_MESSAGE:
            messages.append(PromptMessage(Role.USER, entry.content))
        else:
            messages.append(PromptMessage(Role.ASSISTANT, entry.content + entry.tool_calls))
            pending.extend(call.call_id for call in entry.tool_calls)
    close_calls()
    return tuple(messages)


def content_json(part: ContentPart) -> dict[str, Any]:
    if part.kind is PartKind.TEXT:
        return {"text": part.as_text()}
    if part.kind is PartKind.JSON:
        return {"json": part.as_text()}
    if part.kind is PartKind.PROVIDER_BLOCK:
        envelope = part.envelope
        block = {"provider": envelope.provider.value, "type": envelope.block_type}
        if envelope.call_id:
            block["call_id"] = envelope.call_id
        block["json"] = part.as_text()
        return {"provider_block": block}
    data = b64encode_sliced(part.data)
    return {"binary": {"mime_type": part.mime_type, "data": data}}


def _part_json(part: PromptPart) -> dict[str, Any]:
    if isinstance(part, ContentPart):
        return content_json(part)
    if isinstance(part, ToolCall):
        return {
            "tool_call": {
                "call_id": part.call_id,
                "name": part.name,
                "arguments_json": part.arguments_json,
            }
        }
    return {
        "tool_result": {
            "call_id": part.call_id,
            "is_error": part.is_error,
            "elided": part.elided,
            "handle": part.handle,
            "content": [content_json(c) for c in part.content],
        }
    }


def message_json(message: PromptMessage) -> dict[str, Any]:
    return {"role": message.role.value, "parts": [_part_json(p) for p in message.parts]}


def tool_json(tool: ExposedTool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "input_schema": json.loads(tool.input_schema_json),
    }


def zone_documents(prompt: Prompt) -> dict[Zone, bytes]:
    """Each zone's canonical JSON, the bytes its digest covers."""
    return {
        Zone.STATIC_SYSTEM: canonical_json(
            {
                "tools": [tool_json(t) for t in prompt.tools],
                "sections": [{"title": s.title, "text": s.text} for s in prompt.static_sections],
            }
        ),
        Zone.DYNAMIC_TAIL: canonical_json({"dynamic_tail": prompt.dynamic_tail}),
        Zone.HISTORY: canonical_json({"history": [message_json(m) for m in prompt.history]}),
        Zone.TRANSIENT: canonical_json({"transient": message_json(prompt.transient)}),
    }


def zone_digests(prompt: Prompt) -> tuple[ZoneDigest, ...]:
    return tuple(
        ZoneDigest(zone, len(document), hashlib.sha256(document).hexdigest())
        for zone, document in zone_documents(prompt).items()
    )

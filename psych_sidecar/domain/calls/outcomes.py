"""A tool call's result: before it is recorded (:class:`ToolResult`), and as recorded
(:class:`ToolOutcome`); or, when its server asked for input first, the questions
(:class:`Asking`) and the call waiting for their answers (:class:`WaitingCall`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psych_sidecar.domain.calls.task_types import ToolTask
from psych_sidecar.domain.canonical import canonical_json, sorted_keys
from psych_sidecar.domain.catalog import AuthorizationReason, InputAsked, InputRequest, InputWait
from psych_sidecar.domain.runlog import ContentPart, PartKind, RecordedCall
from psych_sidecar.domain.surface import mcp_result_json


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A result before it is recorded: what the model sees (`content`), the MCP
    CallToolResult JSON the host gets, and the MCP tool it is recorded under (empty for a
    result no one MCP tool gave; the router then records it under the name the model
    called). `authorization`: why the call failed, when it is that its connection needs
    authorizing (told to the host beside the result, not recorded)."""

    is_error: bool
    result_json: bytes
    content: tuple[ContentPart, ...]
    server: str = ""
    tool: str = ""
    authorization: AuthorizationReason | None = None
    # The task the call started as on its server (told to the host beside the result).
    task: ToolTask | None = None

    @classmethod
    def of(
        cls, content: tuple[ContentPart, ...], is_error: bool = False, source_handle: str = ""
    ) -> ToolResult:
        """A result the sidecar made (see `mcp_result_json` for `source_handle`)."""
        return cls(is_error, mcp_result_json(content, is_error, source_handle), content)

    @classmethod
    def error(
        cls,
        message: str,
        server: str = "",
        tool: str = "",
        *,
        authorization: AuthorizationReason | None = None,
    ) -> ToolResult:
        """What the model got wrong, or what went wrong for it: a tool result with is_error
        set, the one way every tool says so."""
        content = (ContentPart.text(message),)
        return cls(True, mcp_result_json(content, True), content, server, tool, authorization)

    @classmethod
    def structured(cls, value: Any) -> ToolResult:
        """A JSON value the sidecar answers with (a meta tool's listing, description or
        search): canonical JSON, as text and as structured content."""
        text = canonical_json(sorted_keys(value)).decode()
        result = {
            "content": [{"type": "text", "text": text}],
            "isError": False,
            "structuredContent": value,
        }
        return cls(
            False, canonical_json(sorted_keys(result)), (ContentPart(PartKind.JSON, text.encode()),)
        )


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """A result as recorded in the Run's log: what the host gets for a call; with why the
    call failed when it is that its connection needs authorizing (the call that failed
    only: a retry's answer, read back from the log, does not say)."""

    is_error: bool
    result_json: bytes
    sequence: int
    handle: str
    authorization: AuthorizationReason | None = None
    # The task the call started as (the call that started it only, as `authorization`).
    task: ToolTask | None = None

    @classmethod
    def of(cls, recorded: RecordedCall) -> ToolOutcome:
        return cls(recorded.is_error, recorded.result_json, recorded.sequence, recorded.handle)


@dataclass(frozen=True, slots=True)
class Asking:
    """A call whose server asked for input before it answered: what it asked, and what
    repeating the call needs (the MCP tool and the arguments it was sent)."""

    asked: InputAsked
    server: str
    tool: str
    arguments: Mapping[str, Any]


CallResult = ToolResult | Asking
"""What running a call gives: a result to record, or questions to wait on."""


@dataclass(frozen=True, slots=True)
class WaitingCall:
    """A call waiting for its user's input, as the host gets it: the call, the round's
    attempt to echo, the server's questions and until when they are awaited."""

    call_id: str
    attempt: str
    server: str
    tool: str
    requests: tuple[InputRequest, ...]
    expire_time: datetime
    protocol_version: str

    @classmethod
    def of(cls, wait: InputWait) -> WaitingCall:
        return cls(
            wait.call_id,
            wait.attempt,
            wait.server,
            wait.tool,
            wait.asked.requests,
            wait.expire_time,
            wait.asked.protocol_version,
        )


CallOutcome = ToolOutcome | WaitingCall
"""What a call answers the host: its recorded outcome, or that it waits for input."""

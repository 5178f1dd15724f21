"""A server's questions in the middle of a tool call, and the answers the host's user gives.

An MCP server may need something from the user before it can answer a tools/call: a form to
fill (elicitation, form mode) or a URL for the user to open (URL mode). On 2026-07-28 it answers
the call with `resultType: "input_required"`, its requests and an opaque request state the
client echoes when it repeats the call with the answers (multi-round-trip requests); on
2025-11-25 it sends `elicitation/create` while the call is open, and waits for the answer.
Either way the call does not end: the runner returns :class:`InputAsked`, the host shows the
questions to its user, and the call continues with the :class:`InputAnswer` s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# Revisions where the questions come in the result and the call is repeated with the
# answers (stateless: any sidecar can continue); older ones hold them in the session.
STATELESS_REVISIONS = frozenset({"2026-07-28"})


class InputMode(StrEnum):
    FORM = "form"
    URL = "url"


class InputAction(StrEnum):
    ACCEPT = "accept"
    DECLINE = "decline"
    CANCEL = "cancel"


@dataclass(frozen=True, slots=True)
class InputRequest:
    """One question as the server sent it. `key`: the server's key for it (2026-07-28) or
    the id of its elicitation/create request (2025-11-25). `request_json`: the request as
    sent (MCP JSON), whole."""

    key: str
    mode: InputMode
    message: str
    request_json: bytes
    requested_schema_json: bytes = b""
    url: str = ""
    elicitation_id: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "mode": self.mode.value,
            "message": self.message,
            "request": json.loads(self.request_json),
            "requestedSchema": json.loads(self.requested_schema_json or b"null"),
            "url": self.url,
            "elicitationId": self.elicitation_id,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> InputRequest:
        schema = value.get("requestedSchema")
        return cls(
            key=str(value["key"]),
            mode=InputMode(value["mode"]),
            message=str(value["message"]),
            request_json=json.dumps(value["request"], separators=(",", ":")).encode(),
            requested_schema_json=(
                b"" if schema is None else json.dumps(schema, separators=(",", ":")).encode()
            ),
            url=str(value.get("url", "")),
            elicitation_id=str(value.get("elicitationId", "")),
        )


@dataclass(frozen=True, slots=True)
class InputAsked:
    """A call the server did not answer yet: it asked `requests` first. On a stateless
    revision `request_state` is what the server wants echoed (None: it sent none, and none
    is sent back); on 2025-11-25 `held` names the call held open in this sidecar's session."""

    requests: tuple[InputRequest, ...]
    protocol_version: str
    request_state: str | None = None
    held: str = ""

    @property
    def stateless(self) -> bool:
        return self.protocol_version in STATELESS_REVISIONS


@dataclass(frozen=True, slots=True)
class InputAnswer:
    """The user's answer to one request: `content` only with ACCEPT of a form."""

    key: str
    action: InputAction
    content: Mapping[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"key": self.key, "action": self.action.value}
        if self.content is not None:
            answer["content"] = dict(self.content)
        return answer


def with_defaults(schema_json: bytes, content: Mapping[str, Any] | None) -> dict[str, Any]:
    """An accepted form's content with the requested schema's `default` of every property
    the user left out (SEP-1034: the client applies the defaults a server states)."""
    filled = dict(content or {})
    try:
        schema = json.loads(schema_json or b"{}")
    except ValueError:
        return filled
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(properties, dict):
        for name, spec in properties.items():
            if name not in filled and isinstance(spec, dict) and "default" in spec:
                filled[name] = spec["default"]
    return filled


def content_problem(content: Mapping[str, Any]) -> str:
    """Why an accepted form's content cannot go to a server ("" when it can): its values are
    strings, numbers, booleans, lists of strings or null (MCP's ElicitResult)."""
    for name, value in content.items():
        if value is None or isinstance(value, (str, int, float, bool)):
            continue
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            continue
        return f"{name!r}: a form's value is a string, number, boolean, list of strings or null"
    return ""

"""A server's questions in the middle of a tools/call, in both protocol eras.

2026-07-28 (multi-round-trip requests): the server answers `resultType: "input_required"` with
its input requests and an opaque `requestState`; `asked_of` makes that an `InputAsked`, and
`input_responses` makes the host's answers what the repeated call carries. Nothing is held
here: the request state travels with the wait (stored by the domain), so any sidecar can
repeat the call.

2025-11-25: the server sends `elicitation/create` while the tools/call is open and waits for the
answer. `HeldCalls` runs each tools/call of such a session as a task of the session's owner
(it ends with the session), gives the call's first question to the caller as an `InputAsked`,
and holds the question open until the host answers or `answer_timeout` passes (then the server
is told "cancel"). The sidecar never opens or fetches a URL a question names.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.abc
import mcp_types as types
from mcp import MCPError
from mcp.client.session import ClientRequestContext

from psych_sidecar.domain.catalog import (
    InputAction,
    InputAnswer,
    InputAsked,
    InputMode,
    InputRequest,
    ToolCallFailed,
    with_defaults,
)

log = logging.getLogger(__name__)

# A held question outlives its wait by this much, so that an answer the domain still takes
# (its round not expired yet) always finds it.
ANSWER_GRACE_SECONDS = 5.0

# The most questions one round may hold, and the longest request state kept for a server.
MAX_INPUT_REQUESTS = 32
MAX_REQUEST_STATE_CHARS = 1024 * 1024

# What the sidecar declares to every server: elicitation, form and URL mode (the host's user
# answers through ContinueToolCall).
ELICITATION = types.ElicitationCapability(
    form=types.FormElicitationCapability(), url=types.UrlElicitationCapability()
)


class Unanswerable(Exception):
    """A server asked for something no host answers here (sampling, roots): the call ends
    as a tool error saying so."""


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def request_of(key: str, params: types.ElicitRequestParams) -> InputRequest:
    """One elicitation as the host sees it; `request_json` is the elicitation/create
    request as the server sent it."""
    sent = {
        "method": "elicitation/create",
        "params": params.model_dump(by_alias=True, mode="json", exclude_none=True),
    }
    if isinstance(params, types.ElicitRequestURLParams):
        return InputRequest(
            key=key,
            mode=InputMode.URL,
            message=params.message,
            request_json=_compact(sent),
            url=params.url,
            elicitation_id=params.elicitation_id or "",
        )
    return InputRequest(
        key=key,
        mode=InputMode.FORM,
        message=params.message,
        request_json=_compact(sent),
        requested_schema_json=_compact(params.requested_schema),
    )


def asked_of(result: types.InputRequiredResult, protocol_version: str) -> InputAsked:
    """A 2026-07-28 input_required result as an InputAsked. Raises Unanswerable for a
    request that is not an elicitation, and for more than the bounds allow (a server's
    questions are stored and shown to a user)."""
    if len(result.input_requests or {}) > MAX_INPUT_REQUESTS:
        raise Unanswerable(
            f"it asked {len(result.input_requests or {})} questions at once, more than "
            f"{MAX_INPUT_REQUESTS}"
        )
    if len(result.request_state or "") > MAX_REQUEST_STATE_CHARS:
        raise Unanswerable(f"its request state is over {MAX_REQUEST_STATE_CHARS} characters")
    requests = []
    for key, request in (result.input_requests or {}).items():
        if not isinstance(request, types.ElicitRequest):
            raise Unanswerable(f"it asked for {request.method}, which this client does not offer")
        requests.append(request_of(key, request.params))
    return InputAsked(tuple(requests), protocol_version, request_state=result.request_state)


def elicit_result(request: InputRequest, answer: InputAnswer | None) -> types.ElicitResult:
    """The answer as the server gets it: a form accepted carries its content, with the
    schema's defaults for what the user left out; no answer is a cancel."""
    if answer is None:
        return types.ElicitResult(action="cancel")
    if answer.action is InputAction.DECLINE:
        return types.ElicitResult(action="decline")
    if answer.action is InputAction.CANCEL:
        return types.ElicitResult(action="cancel")
    if request.mode is InputMode.URL:
        return types.ElicitResult(action="accept")
    content = with_defaults(request.requested_schema_json, answer.content)
    return types.ElicitResult.model_validate({"action": "accept", "content": content})


def input_responses(
    asked: InputAsked, answers: Sequence[InputAnswer]
) -> dict[str, types.InputResponse]:
    by_key = {answer.key: answer for answer in answers}
    return {
        request.key: elicit_result(request, by_key.get(request.key)) for request in asked.requests
    }


@dataclass(eq=False)
class _Question:
    request: InputRequest
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: types.ElicitResult | None = None


@dataclass(eq=False)
class _Done:
    result: types.CallToolResult | None
    error: BaseException | None


@dataclass(eq=False)
class _Held:
    key: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    question: _Question | None = None
    # Its question went unanswered: nobody reads the rest, so it goes when it ends.
    abandoned: bool = False
    # Its tools/call ended (the end may not be read yet): it asks nothing more.
    finished: bool = False
    # What the call did next (a question, or its end), in order; read by the caller.
    events: list[_Question | _Done] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def tell(self, event: _Question | _Done) -> None:
        self.events.append(event)
        changed, self.changed = self.changed, anyio.Event()
        changed.set()


class HeldCalls:
    """One 2025-11-25 session's tools/calls, each a task of the owner's task group (`serve_in`)
    so a question can stay open while the host asks its user. At most `max_held` at once."""

    def __init__(self, *, answer_timeout: float, max_held: int, protocol_version: str) -> None:
        self._answer_timeout = answer_timeout
        self._max_held = max_held
        self.protocol_version = protocol_version
        self._calls: dict[str, _Held] = {}
        self._group: anyio.abc.TaskGroup | None = None

    def serve_in(self, group: anyio.abc.TaskGroup | None, protocol_version: str = "") -> None:
        """The session's task group (None: the session ended, and its calls with it)."""
        self._group = group
        if protocol_version:
            self.protocol_version = protocol_version
        if group is None:
            self._calls.clear()

    async def on_elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """The SDK's elicitation callback. The question belongs to the oldest call of the
        session not already waiting on one (2025-11-25 does not say which call asks; a
        server asks from inside a call, and calls that wait do not ask again)."""
        held = next(
            (h for h in self._calls.values() if h.question is None and not h.finished), None
        )
        if held is None:
            return types.ElicitResult(action="decline")
        question = _Question(request_of(str(context.request_id), params))
        held.question = question
        held.tell(question)
        with anyio.move_on_after(self._answer_timeout + ANSWER_GRACE_SECONDS):
            await question.answered.wait()
        held.question = None
        if question.answer is None:
            held.abandoned = True
            log.info("MCP question %s: no answer in %gs, cancelled", held.key, self._answer_timeout)
            return types.ElicitResult(action="cancel")
        return question.answer

    async def start(
        self, call: Callable[[], Awaitable[types.CallToolResult]], timeout_seconds: float
    ) -> types.CallToolResult | InputAsked:
        """Run `call` held: its result, or its first question."""
        group = self._group
        if group is None:
            raise ToolCallFailed("the session ended before the call started")
        if len(self._calls) >= self._max_held:
            raise ToolCallFailed(
                f"{len(self._calls)} calls on this server already wait for their user; "
                "answer one first"
            )
        held = _Held(uuid.uuid4().hex)
        self._calls[held.key] = held

        async def run() -> None:
            outcome = _Done(None, None)
            try:
                with held.scope:
                    outcome = _Done(await call(), None)
            except Exception as error:
                outcome = _Done(None, error)
            finally:
                if outcome.result is None and outcome.error is None:
                    # Cancelled: the session ended under it, or the caller gave up.
                    closed = MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")
                    outcome = _Done(None, closed)
                held.finished = True
                held.tell(outcome)
                if held.abandoned:
                    self._calls.pop(held.key, None)

        group.start_soon(run)
        return await self._next(held, timeout_seconds)

    async def answer(
        self, key: str, answers: Sequence[InputAnswer], timeout_seconds: float
    ) -> types.CallToolResult | InputAsked:
        """Answer the held call's open question; then its result, or its next question.
        Raises ToolCallFailed when the call is no longer held (its session ended)."""
        held = self._calls.get(key)
        if held is None:
            raise ToolCallFailed(
                "its question was lost: the session that held it ended (the sidecar or the "
                "server restarted)"
            )
        question = held.question
        if question is not None and held.events and held.events[0] is question:
            held.events.pop(0)
            by_key = {answer.key: answer for answer in answers}
            question.answer = elicit_result(question.request, by_key.get(question.request.key))
            question.answered.set()
        elif held.events and isinstance(held.events[0], _Question):
            # Its question expired meanwhile (the server was told cancel): what came after.
            held.events.pop(0)
        return await self._next(held, timeout_seconds)

    async def _next(self, held: _Held, timeout_seconds: float) -> types.CallToolResult | InputAsked:
        """The held call's next event: a question, or its end (a result, or an error
        raised). Past `timeout_seconds` the call is cancelled: TimeoutError."""
        with anyio.move_on_after(timeout_seconds if timeout_seconds > 0 else math.inf) as waiting:
            while not held.events:
                await held.changed.wait()
        if waiting.cancelled_caught:
            held.scope.cancel()
            self._calls.pop(held.key, None)
            raise TimeoutError
        event = held.events[0]
        if isinstance(event, _Question):
            return InputAsked((event.request,), self.protocol_version, held=held.key)
        self._calls.pop(held.key, None)
        if event.error is not None:
            raise event.error
        assert event.result is not None
        return event.result

    def __len__(self) -> int:
        return len(self._calls)

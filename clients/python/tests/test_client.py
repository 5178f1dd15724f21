"""The Python host client against a real sidecar process."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from psych_sidecar_client import (
    ErrorReason,
    SidecarClient,
    SidecarError,
    anthropic_record,
    connect,
    gemini_record,
    openai_record,
    request_body,
)

from psych.sidecar.v1 import (
    content_pb2,
    run_pb2,
    run_service_pb2,
    spec_pb2,
    spec_service_pb2,
    turn_service_pb2,
)

READY_TIMEOUT_SECONDS = 30.0


def _sidecar_command() -> list[str]:
    configured = os.environ.get("PSYCH_SIDECAR_BIN")
    if configured:
        return [configured]
    beside = Path(sys.executable).parent / "psych-sidecar"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("psych-sidecar")
    return [found] if found else [sys.executable, "-m", "psych_sidecar"]


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Sidecar:
    unix_address: str
    tcp_address: str
    database: Path


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """`psych-sidecar serve` on a Unix socket and loopback TCP, SQLite in a temporary
    directory. Waited for with the client's own connect() once its socket file is there
    (connect says at once that a socket is missing): that is the readiness wait under test."""
    yield from _serve(tmp_path_factory.mktemp("client"), {})


@pytest.fixture(scope="module")
def impatient_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A sidecar that waits only 0.2 s for a held write lock before answering
    STORAGE_UNAVAILABLE, so the client sees that answer rather than its own deadline."""
    yield from _serve(
        tmp_path_factory.mktemp("impatient"),
        {"PSYCH_SIDECAR_DATABASE_BUSY_TIMEOUT_SECONDS": "0.2"},
    )


def _serve(directory: Path, extra_env: dict[str, str]) -> Iterator[Sidecar]:
    socket_path = directory / "s.sock"
    tcp = f"127.0.0.1:{_free_loopback_port()}"
    database = directory / "sidecar.db"
    log = directory / "sidecar.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                *_sidecar_command(),
                "serve",
                "--listen",
                f"unix://{socket_path}",
                "--listen",
                tcp,
                "--database-url",
                f"sqlite:///{database}",
                "--data-dir",
                str(directory),
            ],
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("PSYCH_SIDECAR_")},
                **extra_env,
            },
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not socket_path.exists() and process.poll() is None:
            if time.monotonic() > deadline:
                pytest.fail(f"no socket at {socket_path}\n{log.read_text(errors='replace')}")
            time.sleep(0.05)
        try:
            with connect(f"unix://{socket_path}", ready_timeout=READY_TIMEOUT_SECONDS):
                pass
        except (TimeoutError, FileNotFoundError) as error:
            pytest.fail(f"{error}\n{log.read_text(errors='replace')}")
        yield Sidecar(f"unix://{socket_path}", tcp, database)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    assert process.returncode == 0, log.read_text(errors="replace")


@pytest.fixture
def client(sidecar: Sidecar) -> Iterator[SidecarClient]:
    with connect(sidecar.unix_address) as connected:
        yield connected


@pytest.fixture
def unique() -> Callable[[str], str]:
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:10]}"


def new_run(client: SidecarClient, name: str) -> str:
    client.call(
        client.specs.PublishSpec,
        spec_service_pb2.PublishSpecRequest(spec=spec_pb2.Spec(name=name, version=1)),
    )
    request = run_service_pb2.CreateRunRequest(tenant="t", spec_name=name, spec_version=1)
    return client.call(client.runs.CreateRun, request).run.run_id


class WriteLock:
    """Holds the sidecar's SQLite write lock: its appends wait (up to its 5 s busy timeout)
    until release(), so a client's deadline expires while the append is still to be stored."""

    def __init__(self, database: Path) -> None:
        self._connection = sqlite3.connect(database, isolation_level=None, timeout=30)
        self._connection.execute("BEGIN IMMEDIATE")
        self.held = True

    def release(self) -> None:
        if self.held:
            self._connection.execute("ROLLBACK")
            self._connection.close()
            self.held = False


@pytest.fixture
def hold_write_lock(sidecar: Sidecar) -> Iterator[Callable[[], WriteLock]]:
    """Takes the sidecar's write lock when called (after the test's set-up writes), and
    releases it at the end of the test in any case."""
    locks: list[WriteLock] = []

    def hold() -> WriteLock:
        locks.append(WriteLock(sidecar.database))
        return locks[-1]

    yield hold
    for lock in locks:
        lock.release()


@dataclass
class Attempt:
    request_id: str
    code: grpc.StatusCode


class AppendAttempts(grpc.UnaryUnaryClientInterceptor):
    """Records every AppendRecords attempt the client makes, and releases the write lock
    once the first one has failed with DEADLINE_EXCEEDED: that response is lost, the
    append itself then completes in the sidecar, and the client's retry must find it."""

    def __init__(self, lock: WriteLock | None = None) -> None:
        self.lock = lock
        self.attempts: list[Attempt] = []

    def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> Any:
        outcome = continuation(client_call_details, request)
        if str(client_call_details.method).endswith("/AppendRecords"):
            assert isinstance(request, run_service_pb2.AppendRecordsRequest)
            self.attempts.append(Attempt(request.request_id, outcome.code()))
            if self.lock is not None and outcome.code() in (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNAVAILABLE,
            ):
                self.lock.release()
        return outcome


def _user(text: str) -> run_pb2.Record:
    return run_pb2.Record(
        user_message=run_pb2.UserMessage(content=[content_pb2.ContentPart(text=text)])
    )


def _tool_result(call_id: str, text: str) -> run_pb2.Record:
    return run_pb2.Record(
        tool_result=run_pb2.ToolResult(
            call_id=call_id, content=[content_pb2.ContentPart(text=text)]
        )
    )


def _stored(client: SidecarClient, run_id: str) -> list[run_pb2.Record]:
    request = run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=1000)
    return list(client.call(client.runs.ListRecords, request).records)


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_connect_dials_a_unix_socket_or_a_tcp_address(
    sidecar: Sidecar, transport: str, unique: Callable[[str], str]
) -> None:
    address = sidecar.unix_address if transport == "unix" else sidecar.tcp_address
    with connect(address, ready_timeout=5) as client:
        run_id = new_run(client, unique("agent"))
        request = run_service_pb2.GetRunRequest(run_id=run_id)
        assert client.call(client.runs.GetRun, request).run.run_id == run_id


def test_connect_gives_up_after_the_ready_timeout(tmp_path: Path) -> None:
    # A socket file nobody accepts on (bound, not listening): connect waits, then gives up.
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(tmp_path / "nobody.sock"))
        with pytest.raises(TimeoutError, match=r"not SERVING within 0\.5 s"):
            connect(f"unix://{tmp_path / 'nobody.sock'}", ready_timeout=0.5)


def test_connect_names_a_missing_socket_at_once(tmp_path: Path) -> None:
    """Before: 20 s of retries, then "not SERVING (UNAVAILABLE)", the path never named. The
    ready timeout here is an hour: only an answer at once passes."""
    with pytest.raises(FileNotFoundError) as caught:
        connect(f"unix://{tmp_path / 'nobody.sock'}", ready_timeout=3600)
    assert str(caught.value) == (
        f"no socket at {tmp_path / 'nobody.sock'} (from unix://{tmp_path / 'nobody.sock'}): "
        "is the sidecar running, and listening there?"
    )
    relative = "unix:psych-sidecar-data/sidecar.sock"
    with pytest.raises(FileNotFoundError) as caught:
        connect(relative, ready_timeout=3600)
    absolute = Path.cwd() / "psych-sidecar-data" / "sidecar.sock"
    assert str(caught.value).startswith(f"no socket at {absolute} (from {relative}): ")


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("", "no sidecar address: give the one scripts/serve prints"),
        ("/run/psych/sidecar.sock", "/run/psych/sidecar.sock is a socket path without unix:"),
        ("psych-sidecar-data/sidecar.sock", "write unix:psych-sidecar-data/sidecar.sock"),
    ],
)
def test_connect_says_at_once_what_is_wrong_with_an_address(address: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        connect(address, ready_timeout=3600)


def test_connect_refuses_a_file_that_is_not_a_socket(tmp_path: Path) -> None:
    (tmp_path / "sidecar.sock").write_text("")
    with pytest.raises(ValueError, match=r"sidecar\.sock \(from unix:.*\) is not a socket$"):
        connect(f"unix:{tmp_path / 'sidecar.sock'}", ready_timeout=3600)


def test_an_error_info_becomes_an_error_reason_to_switch_on(client: SidecarClient) -> None:
    with pytest.raises(SidecarError) as caught:
        client.call(client.runs.GetRun, run_service_pb2.GetRunRequest(run_id="run_nope"))
    error = caught.value
    assert error.reason == ErrorReason.ERROR_REASON_RUN_NOT_FOUND
    assert error.reason_name == "RUN_NOT_FOUND"
    assert error.code == grpc.StatusCode.NOT_FOUND
    assert error.metadata == {"run_id": "run_nope"}

    with pytest.raises(SidecarError) as caught:
        client.call(client.runs.CreateRun, run_service_pb2.CreateRunRequest(spec_name="x"))
    assert caught.value.reason == ErrorReason.ERROR_REASON_FIELD_REQUIRED
    assert caught.value.metadata["field"] == "tenant"


def test_every_call_has_a_deadline(
    sidecar: Sidecar, unique: Callable[[str], str], hold_write_lock: Callable[[], WriteLock]
) -> None:
    with connect(sidecar.unix_address, call_timeout=0.5) as client:
        run_id = new_run(client, unique("agent"))
        hold_write_lock()
        request = run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[_user("hi")])
        with pytest.raises(SidecarError) as caught:
            client.call(client.runs.AppendRecords, request)
    assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    # gRPC's own failure: no ErrorInfo, so no reason.
    assert caught.value.reason == ErrorReason.ERROR_REASON_UNSPECIFIED


def test_a_lost_append_response_is_retried_with_its_request_id_and_stored_once(
    sidecar: Sidecar, unique: Callable[[str], str], hold_write_lock: Callable[[], WriteLock]
) -> None:
    spy = AppendAttempts()
    with connect(sidecar.unix_address, interceptors=[spy]) as client:
        run_id = new_run(client, unique("agent"))
        spy.lock = hold_write_lock()
        request = run_service_pb2.AppendRecordsRequest(
            run_id=run_id, request_id="turn-1", records=[_user("hi"), _tool_result("c1", "ok")]
        )
        answer = client.append_records(request, attempts=5, timeout=1.0)

        assert spy.attempts[0].code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert spy.attempts[-1].code == grpc.StatusCode.OK
        assert {attempt.request_id for attempt in spy.attempts} == {"turn-1"}
        assert [r.sequence for r in answer.records] == [1, 2]
        assert answer.records[1].handle
        stored = _stored(client, run_id)
        assert [r.sequence for r in stored] == [1, 2]
        assert stored[1].handle == answer.records[1].handle
        # Asking again answers the same again: the first append's answer.
        assert client.append_records(request) == answer
        assert len(_stored(client, run_id)) == 2


def test_a_request_without_an_id_gets_one_that_every_attempt_reuses(
    sidecar: Sidecar, unique: Callable[[str], str], hold_write_lock: Callable[[], WriteLock]
) -> None:
    spy = AppendAttempts()
    with connect(sidecar.unix_address, interceptors=[spy]) as client:
        run_id = new_run(client, unique("agent"))
        spy.lock = hold_write_lock()
        request = run_service_pb2.AppendRecordsRequest(run_id=run_id, records=[_user("hi")])
        answer = client.append_records(request, attempts=5, timeout=1.0)

        assert len(spy.attempts) >= 2
        request_ids = {attempt.request_id for attempt in spy.attempts}
        assert len(request_ids) == 1
        assert request_ids != {""}
        assert request.request_id == ""  # the caller's request is left as it was
        assert [r.sequence for r in answer.records] == [1]
        assert len(_stored(client, run_id)) == 1


def test_append_retries_are_bounded_and_never_store_twice(
    sidecar: Sidecar, unique: Callable[[str], str], hold_write_lock: Callable[[], WriteLock]
) -> None:
    spy = AppendAttempts()
    with connect(sidecar.unix_address, interceptors=[spy]) as client:
        run_id = new_run(client, unique("agent"))
        lock = hold_write_lock()
        request = run_service_pb2.AppendRecordsRequest(
            run_id=run_id, request_id="turn-1", records=[_user("hi")]
        )
        with pytest.raises(SidecarError) as caught:
            client.append_records(request, attempts=3, timeout=0.3)
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert [a.code for a in spy.attempts] == [grpc.StatusCode.DEADLINE_EXCEEDED] * 3

        # Three abandoned attempts are still waiting in the sidecar; they store once.
        lock.release()
        answer = client.append_records(request)
        assert [r.sequence for r in answer.records] == [1]
        assert [r.sequence for r in _stored(client, run_id)] == [1]


def test_storage_unavailable_is_retried_after_the_advised_delay_and_stored_once(
    impatient_sidecar: Sidecar, unique: Callable[[str], str]
) -> None:
    spy = AppendAttempts()
    with connect(impatient_sidecar.unix_address, interceptors=[spy]) as client:
        run_id = new_run(client, unique("agent"))
        spy.lock = WriteLock(impatient_sidecar.database)
        try:
            request = run_service_pb2.AppendRecordsRequest(
                run_id=run_id, request_id="turn-1", records=[_user("hi")]
            )
            with pytest.raises(SidecarError) as caught:
                client.call(client.runs.AppendRecords, request)
            assert caught.value.reason == ErrorReason.ERROR_REASON_STORAGE_UNAVAILABLE
            assert caught.value.code == grpc.StatusCode.UNAVAILABLE
            assert caught.value.retry_delay is not None
            assert caught.value.retry_delay > 0
            spy.attempts.clear()
            spy.lock = WriteLock(impatient_sidecar.database)
            answer = client.append_records(request, attempts=3)
        finally:
            spy.lock.release()
        assert [a.code for a in spy.attempts] == [
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.OK,
        ]
        assert [r.sequence for r in answer.records] == [1]
        assert len(_stored(client, run_id)) == 1


def test_an_error_the_sidecar_answered_is_not_retried(
    sidecar: Sidecar, unique: Callable[[str], str]
) -> None:
    spy = AppendAttempts()
    with connect(sidecar.unix_address, interceptors=[spy]) as client:
        request = run_service_pb2.AppendRecordsRequest(
            run_id=f"run_{unique('nope')}", request_id="turn-1", records=[_user("hi")]
        )
        with pytest.raises(SidecarError) as caught:
            client.append_records(request, attempts=5)
    assert caught.value.reason == ErrorReason.ERROR_REASON_RUN_NOT_FOUND
    assert len(spy.attempts) == 1


def test_a_thinking_models_blocks_go_back_in_its_own_body(
    client: SidecarClient, unique: Callable[[str], str]
) -> None:
    """A host's loop with a thinking model: the response appended with anthropic_record, the
    tool result after it, and the next body (request_body) holding the thinking block as it
    came; the Gemini and OpenAI helpers keep theirs likewise."""
    run_id = new_run(client, unique("thinking"))
    thinking = {"type": "thinking", "thinking": "Look it up.", "signature": "EqQBCgIYAhIM"}
    message = {
        "content": [
            thinking,
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Köln"}},
        ]
    }
    user = run_pb2.Record(
        user_message=run_pb2.UserMessage(content=[content_pb2.ContentPart(text="Weather?")])
    )
    result = run_pb2.Record(
        tool_result=run_pb2.ToolResult(
            call_id="toolu_1", content=[content_pb2.ContentPart(text="18 C")]
        )
    )
    client.append_records(
        run_service_pb2.AppendRecordsRequest(
            run_id=run_id, records=[user, anthropic_record(message), result]
        )
    )
    assembled = client.call(
        client.turns.AssemblePrompt, turn_service_pb2.AssemblePromptRequest(run_id=run_id)
    )
    body = request_body(assembled, content_pb2.PROVIDER_ANTHROPIC)
    sent = json.loads(body)["messages"][1]["content"]
    assert sent[0] == thinking
    assert [b["type"] for b in sent] == ["thinking", "text", "tool_use"]
    assert b"EqQBCgIYAhIM" not in request_body(assembled, content_pb2.PROVIDER_OPENAI)

    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "weather",
        "arguments": "{}",
    }
    record = openai_record({"output": [reasoning, call]})
    assert [p.provider_block.type for p in record.assistant_message.content] == [
        "reasoning",
        "function_call",
    ]
    assert record.assistant_message.tool_calls[0].call_id == "call_1"
    signed = {"functionCall": {"name": "weather", "args": {}}, "thoughtSignature": "Q2lR"}
    gemini = gemini_record(
        {"candidates": [{"content": {"role": "model", "parts": [signed]}}]}, ["g1"]
    )
    (block,) = gemini.assistant_message.content
    assert (block.provider_block.type, block.provider_block.call_id) == ("functionCall", "g1")
    assert json.loads(block.provider_block.json) == signed


def test_a_call_from_the_code_execution_sandbox_keeps_its_caller() -> None:
    """Programmatic tool calling: the code's server_tool_use, its result block and the
    tool_use it made (its `caller` naming the sandbox) go back as they came, the tool_use
    linked to its call; a direct call is rendered by the sidecar as before."""
    code = {
        "type": "server_tool_use",
        "id": "srvtoolu_1",
        "name": "code_execution",
        "input": {"code": "await weather(city='Oslo')"},
    }
    made = {
        "type": "tool_use",
        "id": "toolu_2",
        "name": "weather",
        "input": {"city": "Oslo"},
        "caller": {"type": "code_execution_20260120", "tool_id": "srvtoolu_1"},
    }
    direct = {
        "type": "tool_use",
        "id": "toolu_3",
        "name": "weather",
        "input": {},
        "caller": {"type": "direct"},
    }
    output = {
        "type": "code_execution_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": {"type": "code_execution_result", "stdout": "", "stderr": "", "return_code": 0},
    }
    record = anthropic_record({"content": [code, made, direct, output]})
    kept = [
        (p.provider_block.type, p.provider_block.call_id, json.loads(p.provider_block.json))
        for p in record.assistant_message.content
    ]
    assert kept == [
        ("server_tool_use", "", code),
        ("tool_use", "toolu_2", made),
        ("code_execution_tool_result", "", output),
    ]
    assert [c.call_id for c in record.assistant_message.tool_calls] == ["toolu_2", "toolu_3"]


def test_anthropic_record_keeps_a_compaction_block_first() -> None:
    """A response of Anthropic's own compaction: the compaction block is kept as a provider
    block, in place, for the next body to start its history there (docs/prompt.md)."""
    compaction = {"type": "compaction", "content": "Summary.", "encrypted_content": "Eo0B"}
    record = anthropic_record({"content": [compaction, {"type": "text", "text": "Go on."}]})
    first, second = record.assistant_message.content
    assert first.provider_block.provider == content_pb2.PROVIDER_ANTHROPIC
    assert first.provider_block.type == "compaction"
    assert json.loads(first.provider_block.json) == compaction
    assert second.text == "Go on."

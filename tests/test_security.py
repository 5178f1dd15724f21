"""Security boundaries, tried as an attacker would, against the real server (docs/security.md).

Untrusted: the model (tool arguments, grep patterns), MCP servers (schemas, results, stderr)
and connection records (what a host puts through ConnectionService). Trusted: the operator's
configuration and the host machine. Each test here failed on the code before its fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import http.server
import ipaddress
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    run_service_pb2,
    spec_pb2,
    tool_service_pb2,
    turn_service_pb2,
)
from tests.support.connections import fixture_commands, fixture_http, listed, put_http, put_stdio
from tests.support.databases import TEST_SECRET_KEY
from tests.support.processes import free_port, running
from tests.support.prompts import append, dispatch, result, run_with
from tests.support.requests import publish
from tests.support.settings import flat_settings
from tests.support.sidecar import RunningSidecar, Stubs, rpc_failure

MIB = 1024 * 1024
HOSTILE_SERVER = Path(__file__).parent / "mcp_servers" / "hostile_server.py"
ALL_TOOLS = [spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")]


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the `marker` command leaves a file named after its argument when it starts, so a
    test can tell whether a process was started at all."""
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def sidecar_overrides(marker_dir: Path) -> dict[str, Any]:
    """The fixture server, plus `marker`: a process that only proves it was started."""
    touch = "import pathlib, sys; pathlib.Path(sys.argv[1], sys.argv[2]).touch()"
    return {
        "mcp_commands": {
            **fixture_commands(),
            "hostile": {"argv": [sys.executable, str(HOSTILE_SERVER)], "allow_extra_args": True},
            "marker": {
                "argv": [sys.executable, "-c", touch, str(marker_dir)],
                "allow_extra_args": True,
                "allowed_env": ["APP_*", "PYTHONUNBUFFERED"],
            },
        },
        "mcp_connect_timeout_seconds": 10,
        # No background encoding for search: the CPU test measures this process.
        "semantic_search": "off",
        "mcp_reconnect_min_seconds": 30,
    }


# 1. A connection's environment is the operator's to allow.


@pytest.mark.parametrize(
    "env",
    [
        {"LD_PRELOAD": "/tmp/evil.so"},
        {"PYTHONPATH": "/tmp/evil"},
        {"PYTHONSTARTUP": "/tmp/evil.py"},
        {"NODE_OPTIONS": "--require /tmp/evil.js"},
        {"PATH": "/tmp/evil"},
        {"APP_TOKEN": "fine", "LD_LIBRARY_PATH": "/tmp/evil"},
        {"UNLISTED": "x"},
    ],
    ids=lambda env: "+".join(env),
)
def test_a_connection_cannot_set_loader_or_interpreter_variables(
    stubs: Stubs, unique: Callable[[str], str], marker_dir: Path, env: dict[str, str]
) -> None:
    tenant, name = unique("tenant"), unique("conn")
    failure = rpc_failure(lambda: put_stdio(stubs, tenant, name, "marker", [name], env=env))
    assert failure.code == grpc.StatusCode.PERMISSION_DENIED
    assert failure.info.reason == "COMMAND_NOT_ALLOWED"
    assert failure.info.metadata["command"] == "marker"
    assert failure.info.metadata["env"] in env
    # Nothing stored, no process started.
    assert name not in listed(stubs, tenant)
    assert not (marker_dir / name).exists()


def test_the_env_names_the_operator_allows_reach_the_process(
    stubs: Stubs, unique: Callable[[str], str], marker_dir: Path
) -> None:
    tenant, name = unique("tenant"), unique("conn")
    env = {"APP_TOKEN": "t", "PYTHONUNBUFFERED": "1"}  # a prefix entry, and an exact one
    put_stdio(stubs, tenant, name, "marker", [name], env=env)
    assert (marker_dir / name).exists()
    stubs.connections.DeleteConnection(
        connection_service_pb2.DeleteConnectionRequest(tenant=tenant, name=name)
    )


# 2. Every pattern runs in bounded time and memory.

# RE2's DFA gives up on this one (the pinned google-re2) and its NFA then costs ~30 µs a byte:
# a minute for 2 MB, unbounded. Its program (1925 instructions) is under the size cap.
SLOW_PATTERN = "(?:a?){640}a{640}b"


def stored_result(stubs: Stubs, run_id: str, text: str) -> str:
    (appended,) = append(stubs, run_id, result("c", text))
    return appended.handle


@pytest.fixture(scope="module")
def big_results(stubs: Stubs) -> tuple[str, str, str]:
    """A Run with two 2 MB results: one line of 'a's, and 'a' lines of 20 KB."""
    run_id = run_with(stubs, "grep-attack")
    one_line = stored_result(stubs, run_id, "a" * (2 * MIB))
    long_lines = stored_result(stubs, run_id, ("a" * 20_000 + "\n") * 105)
    return run_id, one_line, long_lines


@pytest.mark.parametrize("pattern", ["(?:a?){1000}a{1000}", "(.*a){20}"])
def test_costly_patterns_are_refused_typed_and_fast(
    stubs: Stubs, big_results: tuple[str, str, str], pattern: str
) -> None:
    run_id, one_line, _ = big_results
    # Before: 60 s and more of CPU for the first, 7 s for the second (captures over 2 MB).
    failure = rpc_failure(
        lambda: stubs.tools.ReadToolOutput(
            tool_service_pb2.ReadToolOutputRequest(run_id=run_id, handle=one_line, grep=pattern),
            timeout=5,
        )
    )
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT
    assert failure.info.reason == "PATTERN_TOO_COMPLEX"
    assert failure.info.metadata["field"] == "grep"


def test_the_model_gets_the_same_refusal_as_a_tool_result(
    stubs: Stubs, big_results: tuple[str, str, str]
) -> None:
    run_id, one_line, _ = big_results
    arguments = {"handle": one_line, "grep": "(?:a?){1000}a{1000}"}
    response = dispatch(stubs, run_id, "m-grep", "read_tool_output", arguments)
    assert response.outcome.is_error
    assert "RE2 program of" in response.outcome.result_json.decode()


def test_a_slow_grep_stops_at_its_cpu_budget_while_other_calls_are_answered(
    stubs: Stubs, big_results: tuple[str, str, str]
) -> None:
    run_id, _, long_lines = big_results
    request = tool_service_pb2.ReadToolOutputRequest(
        run_id=run_id, handle=long_lines, grep=SLOW_PATTERN
    )
    # Before: the scan ran to the end, a minute, and the deadline answered first.
    pending = stubs.tools.ReadToolOutput.future(request, timeout=60)
    answered = threading.Event()
    pending.add_done_callback(lambda _: answered.set())
    answered_meanwhile = 0
    while not answered.wait(0.05):
        stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=run_id), timeout=30)
        answered_meanwhile += not pending.done()
    page = pending.result()
    assert answered_meanwhile > 0
    # Stopped early by the budget: nothing matched so far, continue from next_offset.
    assert list(page.matches) == []
    assert 0 < page.next_offset < page.total_length


def test_a_cancelled_grep_stops_consuming_cpu(tmp_path: Path) -> None:
    # One storage thread: the read after the cancelled grep runs once the grep has given the
    # thread back, so its answer says the grep has ended.
    settings = flat_settings(
        listen=["127.0.0.1:0"],
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        data_dir=tmp_path,
        worker_threads=1,
        semantic_search="off",
    )
    with RunningSidecar(settings) as sidecar, sidecar.stubs() as stubs:
        run_id = run_with(stubs, "grep-cancel")
        long_lines = stored_result(stubs, run_id, ("a" * 20_000 + "\n") * 105)
        request = tool_service_pb2.ReadToolOutputRequest(
            run_id=run_id, handle=long_lines, grep=SLOW_PATTERN
        )
        with pytest.raises(grpc.RpcError) as caught:
            stubs.tools.ReadToolOutput(request, timeout=0.5)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The sidecar runs in this process: its CPU is ours. The grep may finish the chunk
        # under way (under a second); one that kept going would spend the rest of its 5 s
        # budget before the thread is free.
        cpu_before = time.process_time()
        page = stubs.tools.ReadToolOutput(
            tool_service_pb2.ReadToolOutputRequest(run_id=run_id, handle=long_lines, limit=10),
            timeout=60,
        )
        cpu_used = time.process_time() - cpu_before
    assert page.text == "a" * 10
    assert cpu_used < 2.5


def test_grant_globs_match_in_linear_time(stubs: Stubs, unique: Callable[[str], str]) -> None:
    tenant = unique("tenant")
    server = "a" * 40
    put_stdio(stubs, tenant, server, "fixture-fixed")
    hostile = spec_pb2.ToolGrant(server_pattern="*a" * 10 + "b", tool_pattern="*")
    name = unique("globs")
    publish(
        stubs, name, grants=[hostile, spec_pb2.ToolGrant(server_pattern="a*", tool_pattern="echo")]
    )
    run_id = stubs.runs.CreateRun(
        run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=name, spec_version=1)
    ).run.run_id
    # Before: 49 s per match (Python's re backtracking on ".*a.*a…b").
    surface = stubs.turns.ResolveTurn(
        turn_service_pb2.ResolveTurnRequest(run_id=run_id), timeout=10
    ).surface
    # "a*" lets the Run see the server (its line is there whether or not it has connected yet).
    assert [line.server for line in surface.servers] == [server]


def test_grant_globs_are_length_capped_at_publish(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    too_long = spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*a" * 200)
    failure = rpc_failure(lambda: publish(stubs, unique("globs"), grants=[too_long]))
    assert failure.info.reason == "FIELD_INVALID"
    assert failure.info.metadata["field"] == "spec.grants[0].tool_pattern"


# 3. Schema validation makes no network request.


class _Counting(http.server.BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Counting.requests.append(self.path)
        body = b'{"type": "string"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def schema_host() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server that serves a schema to anyone who asks, and remembers who did."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    _Counting.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/schema.json", _Counting.requests
    finally:
        server.shutdown()
        server.server_close()


def run_for(stubs: Stubs, tenant: str, name: str) -> str:
    publish(stubs, name, grants=ALL_TOOLS)
    request = run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=name, spec_version=1)
    return stubs.runs.CreateRun(request).run.run_id


def test_a_remote_ref_in_a_schema_is_never_fetched(
    stubs: Stubs, unique: Callable[[str], str], schema_host: tuple[str, list[str]]
) -> None:
    url, requests = schema_host
    tenant = unique("tenant")
    put_stdio(stubs, tenant, "hostile", "hostile", ["--ref-url", url])
    run_id = run_for(stubs, tenant, unique("agent"))
    arguments = struct_pb2.Struct()
    arguments.update({"x": "anything"})
    outcome = stubs.tools.CallDeferredTool(
        tool_service_pb2.CallDeferredToolRequest(
            run_id=run_id, server="hostile", tool="remote_ref", arguments=arguments, call_id="c1"
        ),
        timeout=30,
    ).outcome
    assert requests == []
    # The unresolvable reference is the call's validation message; nothing was run.
    assert outcome.is_error
    text = outcome.result_json.decode()
    assert "cannot be resolved" in text
    assert "nothing was run" in text


# 4. Secrets never leave; every error keeps its ErrorInfo.


def test_url_credentials_never_appear_in_a_response_or_the_log(
    stubs: Stubs, unique: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tenant = unique("tenant")
    port = free_port()
    secrets = ["PASSWORD-d41d8cd9", "APIKEY-8f00b204", "TOKEN-e9800998"]
    connected = f"http://alice:{secrets[0]}@127.0.0.1:{port}/mcp?key={secrets[1]}&v=2"
    # A wrong path: the HTTP client's 404 error quotes the whole URL.
    broken = f"http://alice:{secrets[0]}@127.0.0.1:{port}/nope?token={secrets[2]}"
    with running(fixture_http(port)):
        replies: list[object] = [
            put_http(stubs, tenant, "good", connected),
            put_http(stubs, tenant, "bad", broken),
            stubs.connections.ListConnections(
                connection_service_pb2.ListConnectionsRequest(tenant=tenant)
            ),
        ]
        good = listed(stubs, tenant)["good"]
        assert good.http.url == f"http://REDACTED@127.0.0.1:{port}/mcp?key=REDACTED&v=REDACTED"
        assert listed(stubs, tenant)["bad"].last_error  # it failed, and said why
        run_id = run_for(stubs, tenant, unique("agent"))
        replies.append(
            stubs.tools.CallDeferredTool(
                tool_service_pb2.CallDeferredToolRequest(
                    run_id=run_id, server="bad", tool="echo", call_id="c1"
                )
            )
        )
    for reply in replies:
        for secret in secrets:
            assert secret not in str(reply)
    for secret in secrets:
        assert secret not in caplog.text


def test_a_megabyte_id_gets_an_error_with_its_error_info(
    stubs: Stubs, unique: Callable[[str], str]
) -> None:
    huge = "r" * MIB
    failure = rpc_failure(lambda: stubs.runs.GetRun(run_service_pb2.GetRunRequest(run_id=huge)))
    assert failure.info.reason == "RUN_NOT_FOUND"
    assert len(failure.info.metadata["run_id"]) < 100
    run_id = run_with(stubs, unique("agent"))
    failure = rpc_failure(
        lambda: stubs.tools.ReadToolOutput(
            tool_service_pb2.ReadToolOutputRequest(run_id=run_id, handle="h" * MIB)
        )
    )
    assert failure.info.reason == "INVALID_DEFERRED_HANDLE"
    failure = rpc_failure(
        lambda: stubs.connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant="t", name="n" * MIB)
        )
    )
    assert failure.info.reason == "FIELD_INVALID"


# 5. A server's stderr is bounded.


def test_a_stderr_flood_leaves_the_sidecar_log_bounded(
    stubs: Stubs,
    unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.INFO)
    tenant = unique("tenant")
    flood = 8 * MIB
    # Before: the 8 MB went straight into the sidecar's own stderr.
    connection = put_stdio(stubs, tenant, "flood", "hostile", ["--flood-bytes", str(flood)])
    assert connection.state == connection_pb2.CONNECTION_STATE_CONNECTED
    outcome = stubs.tools.CallDeferredTool(
        tool_service_pb2.CallDeferredToolRequest(
            run_id=run_for(stubs, tenant, unique("agent")),
            server="flood",
            tool="flood",
            call_id="c1",
        ),
        timeout=60,
    ).outcome
    assert not outcome.is_error  # 2 x 8 MB written, the session unharmed
    assert len(capfd.readouterr().err) < 64 * 1024
    assert len(caplog.text) < 64 * 1024
    assert "stderr line" in caplog.text  # some lines are logged, the rest counted
    recent = listed(stubs, tenant)["flood"].recent_output
    assert recent.startswith("hostile stderr line")
    assert 0 < len(recent.encode()) <= 4096


# 6. TLS on TCP listeners.


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    client: bool = False,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if not client:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _pem(value: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(value, x509.Certificate):
        return value.public_bytes(serialization.Encoding.PEM)
    return value.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclasses.dataclass
class Pki:
    ca: bytes
    cert_file: Path
    key_file: Path
    ca_file: Path
    client_cert: bytes
    client_key: bytes


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    directory = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _certificate("test CA", ca_key, None, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _certificate("sidecar", server_key, (ca_cert, ca_key))
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _certificate("host", client_key, (ca_cert, ca_key), client=True)
    files = {"ca.pem": _pem(ca_cert), "cert.pem": _pem(server_cert), "key.pem": _pem(server_key)}
    for file_name, content in files.items():
        (directory / file_name).write_bytes(content)
    return Pki(
        _pem(ca_cert),
        directory / "cert.pem",
        directory / "key.pem",
        directory / "ca.pem",
        _pem(client_cert),
        _pem(client_key),
    )


@contextlib.contextmanager
def tls_sidecar(
    tmp_path: Path, database_url: str, pki: Pki, mutual: bool
) -> Iterator[RunningSidecar]:
    settings = flat_settings(
        listen=["127.0.0.1:0"],
        database_url=database_url,
        data_dir=tmp_path,
        shutdown_grace_seconds=1,
        semantic_search="off",
        secret_keys=TEST_SECRET_KEY,
        tls_cert_file=pki.cert_file,
        tls_key_file=pki.key_file,
        tls_client_ca_file=pki.ca_file if mutual else None,
    )
    with RunningSidecar(settings) as running:
        yield running


def _health(channel: grpc.Channel) -> int:
    request = health_pb2.HealthCheckRequest()
    status: int = health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status
    return status


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_a_tls_listener_serves_clients_that_trust_its_ca_and_refuses_plaintext(
    tmp_path: Path, database_url: str, pki: Pki, mutual: bool
) -> None:
    with tls_sidecar(tmp_path, database_url, pki, mutual) as running:
        target = running.sidecar.bound[0]
        client = (pki.client_key, pki.client_cert) if mutual else (None, None)
        trusted = grpc.ssl_channel_credentials(pki.ca, *client)
        with grpc.secure_channel(target, trusted) as channel:
            assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as caught:
            _health(channel)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        if mutual:  # trusting the server is not enough: the client must present a certificate
            anonymous = grpc.ssl_channel_credentials(pki.ca)
            with grpc.secure_channel(target, anonymous) as channel, pytest.raises(grpc.RpcError):
                _health(channel)


def test_a_non_loopback_listener_needs_tls_or_an_explicit_insecure_setting(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    common: dict[str, Any] = {"listen": ["0.0.0.0:0"], "allow_non_loopback": True}
    with pytest.raises(ValueError, match="insecure_non_loopback"):
        flat_settings(**common).listen_addresses()
    assert flat_settings(**common, insecure_non_loopback=True).listen_addresses()
    tls = {"tls_cert_file": pki.cert_file, "tls_key_file": pki.key_file}
    assert flat_settings(**common, **tls).listen_addresses()
    with pytest.raises(ValueError, match="go together"):
        flat_settings(listen=["127.0.0.1:0"], tls_cert_file=pki.cert_file).listen_addresses()

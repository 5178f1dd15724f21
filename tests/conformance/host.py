"""The host program the MCP client conformance suite runs: it plays one scenario through the
sidecar's gRPC API only, as a host application would, and never talks to the MCP server.

    python -m tests.conformance.host SERVER_URL

The suite's runner appends the scenario server's URL, names the scenario in
MCP_CONFORMANCE_SCENARIO and, for some, passes a JSON context in MCP_CONFORMANCE_CONTEXT;
PSYCH_SIDECAR_ADDRESS is the sidecar to drive (scripts/test-conformance starts one). The host puts
a streamable-HTTP connection to the URL, waits until the sidecar has connected (or given up),
then calls every tool the server listed once through CallDeferredTool, with arguments made from
each tool's input schema, and deletes the connection. A server that asks for input first
(InputRequired) is answered as a user would: each form accepted as offered (the sidecar applies
the schema's defaults), each URL consented to, through ContinueToolCall. It exits 0 when the
sidecar connected and every call returned a result that is not an error (or the server's
Method not found: a server serving no calls); otherwise it says what
the sidecar reported on stderr and exits 1. For the schema-preservation scenario the host does
what the scenario asks of a client: the focal tool's input schema, as ListCatalogTools gave it,
goes back through the echo tool.

An `auth/` scenario's server needs OAuth, and the host configures the connection's auth as its
user would: the client credentials of the context for the client-credentials scenarios, else the
authorization-code flow with the context's pre-registered client, or the suite's client ID
metadata document URL (dynamic registration when the server does not take one). Whenever the
connection needs authorization, the host signs in as a user would: BeginSignIn, its
authorization URL followed as a browser would (the suite's authorization server approves at
once and redirects to the host's redirect URI, which the host reads without following), and
CompleteSignIn with the redirect's state, code and iss (when it had one). A tool call refused
for want of a scope is retried after signing in again; the host signs in at most MAX_SIGN_INS
times a scenario.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc
from google.protobuf import struct_pb2

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    connection_service_pb2_grpc,
    run_service_pb2,
    run_service_pb2_grpc,
    spec_pb2,
    spec_service_pb2,
    spec_service_pb2_grpc,
    tool_service_pb2,
    tool_service_pb2_grpc,
)

TENANT = "conformance"
# The runner gives a client 30 s per scenario by default (scripts/test-conformance gives more):
# the sidecar's first attempt, listing included, must have ended well within it.
SETTLE_SECONDS = 20.0
CALL_TIMEOUT_SECONDS = 20
# A server asking for input again and again is answered this many rounds at most.
MAX_INPUT_ROUNDS = 5
RPC_TIMEOUT_SECONDS = CALL_TIMEOUT_SECONDS + 10
# The client ID metadata document URL the suite's authorization servers expect (its
# CIMD_CLIENT_METADATA_URL); it need not resolve.
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"
# The host's redirect URI: never served, the host reads the redirect to it without following.
REDIRECT_URI = "http://127.0.0.1:3000/callback"
# Sign-ins a scenario may take: the first, then scope step-ups. The spec asks clients to limit
# re-authorization after repeated insufficient_scope refusals (auth/scope-retry-limit: 3).
MAX_SIGN_INS = 3
BROWSER_TIMEOUT_SECONDS = 10
# The scenario that asks the client to send a tool's input schema back, as it received it,
# through a second tool, to see which JSON Schema 2020-12 keywords survived.
SCHEMA_ECHO_SCENARIO = "json-schema-2020-12-preservation"
SCHEMA_ECHO_FOCAL = "json_schema_2020_12_tool"
SCHEMA_ECHO_TOOL = "json_schema_echo"
# How the sidecar words a server's JSON-RPC Method not found answer to a call.
METHOD_NOT_FOUND = "with error -32601: Method not found"
# A sample value per JSON Schema type, for the arguments of a call.
SAMPLES: dict[str, Any] = {
    "number": 2,
    "integer": 2,
    "string": "conformance",
    "boolean": True,
    "array": [],
    "object": {},
    "null": None,
}


def connection_name(scenario: str) -> str:
    """A connection name for the scenario (names allow letters, digits, '.', '_', '-')."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "-", scenario)[:48]
    return f"{readable}-{hashlib.sha256(scenario.encode()).hexdigest()[:8]}"


def sample_arguments(input_schema_json: bytes) -> dict[str, Any]:
    """Arguments for a call: a sample value for each required property of the schema."""
    schema = json.loads(input_schema_json) if input_schema_json else {}
    properties = schema.get("properties") or {}
    arguments: dict[str, Any] = {}
    for name in schema.get("required") or []:
        declared = (properties.get(name) or {}).get("type", "string")
        kind = declared[0] if isinstance(declared, list) else declared
        arguments[name] = SAMPLES.get(kind, "conformance")
    return arguments


def schema_echo_arguments(tools: list[connection_pb2.CatalogTool]) -> dict[str, Any]:
    """The calls of the schema-preservation scenario: the focal tool's input schema, as the
    sidecar handed it to the host, sent back through the echo tool; the focal tool called with
    arguments its schema takes (an email, as its `else` branch asks)."""
    focal = next((tool for tool in tools if tool.name == SCHEMA_ECHO_FOCAL), None)
    if focal is None:
        return {}
    return {
        SCHEMA_ECHO_TOOL: {"schema": json.loads(focal.input_schema_json)},
        SCHEMA_ECHO_FOCAL: {"email": "conformance@example.com"},
    }


def http_transport(
    scenario: str, url: str, context: dict[str, Any]
) -> connection_pb2.HttpTransport:
    """The connection's transport, with the auth a user would configure for the scenario."""
    transport = connection_pb2.HttpTransport(
        url=url, protocol=connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP
    )
    if not scenario.startswith("auth/"):
        return transport
    if scenario.startswith("auth/client-credentials-"):
        credentials = connection_pb2.OAuthClientCredentials(client_id=context["client_id"])
        if "private_key_pem" in context:
            credentials.private_key_jwt.private_key_pem = context["private_key_pem"]
            credentials.private_key_jwt.algorithm = context.get("signing_algorithm", "")
        else:
            credentials.client_secret = context["client_secret"]
        transport.oauth_client_credentials.CopyFrom(credentials)
        return transport
    code = connection_pb2.OAuthAuthorizationCode(redirect_uri=REDIRECT_URI)
    if "client_id" in context:
        code.registered_client.client_id = context["client_id"]
        code.registered_client.client_secret = context.get("client_secret", "")
    else:
        code.client_metadata_url = CLIENT_METADATA_URL
    transport.oauth_authorization_code.CopyFrom(code)
    return transport


SETTLED_STATES = (
    connection_pb2.CONNECTION_STATE_UNREACHABLE,
    connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED,
)


def find_connection(
    connections: connection_service_pb2_grpc.ConnectionServiceStub, name: str
) -> connection_pb2.Connection:
    listing = connections.ListConnections(
        connection_service_pb2.ListConnectionsRequest(tenant=TENANT, page_size=1000),
        timeout=RPC_TIMEOUT_SECONDS,
    )
    return next(c for c in listing.connections if c.name == name)


def wait_until_settled(
    connections: connection_service_pb2_grpc.ConnectionServiceStub, name: str
) -> connection_pb2.Connection:
    """The connection once its attempt ended: connected with a catalogue, unreachable, or
    waiting for authorization."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        found = find_connection(connections, name)
        connected = found.state == connection_pb2.CONNECTION_STATE_CONNECTED
        if (connected and found.catalog_version > 0) or found.state in SETTLED_STATES:
            return found
        if time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def describe(connection: connection_pb2.Connection) -> str:
    state = connection_pb2.ConnectionState.Name(connection.state)
    if connection.state == connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED:
        reason = connection_pb2.AuthorizationRequiredReason.Name(
            connection.authorization_required_reason
        )
        state = f"{state} ({reason})"
    return f"{state} {connection.last_error}".rstrip()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_: Any, **__: Any) -> None:
        return None


def browse(authorization_url: str) -> tuple[str, str, str | None]:
    """What the user's browser brings back to the host's redirect URI: (state, code, iss or
    None when the redirect had none). The
    authorization server answers the URL with a redirect there, which is read, not followed."""
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(authorization_url, timeout=BROWSER_TIMEOUT_SECONDS) as answer:
            raise RuntimeError(f"the authorization URL answered {answer.status}, not a redirect")
    except urllib.error.HTTPError as answer:
        location = answer.headers.get("Location", "")
        if not 300 <= answer.code < 400 or not location.startswith(REDIRECT_URI):
            raise RuntimeError(
                f"the authorization URL answered {answer.code} {location!r}"
            ) from None
    query = parse_qs(urlsplit(location).query)
    if "error" in query:
        raise RuntimeError(f"the authorization server refused: {query}")
    # The redirect's iss (RFC 9207) goes to CompleteSignIn as it came, or not at all.
    return query["state"][0], query["code"][0], query.get("iss", [None])[0]


def sign_in(
    connections: connection_service_pb2_grpc.ConnectionServiceStub, name: str
) -> connection_pb2.Connection | None:
    """Sign the user in as a host would; the connection after it, None when it failed."""
    try:
        begun = connections.BeginSignIn(
            connection_service_pb2.BeginSignInRequest(tenant=TENANT, name=name),
            timeout=RPC_TIMEOUT_SECONDS,
        )
        print(f"host: sign-in: {begun.authorization_url}", file=sys.stderr)
        state, code, iss = browse(begun.authorization_url)
        completed = connections.CompleteSignIn(
            connection_service_pb2.CompleteSignInRequest(
                tenant=TENANT, state=state, code=code, name=name, iss=iss
            ),
            timeout=RPC_TIMEOUT_SECONDS,
        )
    except (grpc.RpcError, RuntimeError, OSError) as error:
        detail = (
            f"{error.code().name}: {error.details()}" if isinstance(error, grpc.RpcError) else error
        )
        print(f"host: sign-in failed: {detail}", file=sys.stderr)
        return None
    print(f"host: signed in: {describe(completed.connection)}", file=sys.stderr)
    return completed.connection


def catalogue(
    connections: connection_service_pb2_grpc.ConnectionServiceStub, name: str
) -> list[connection_pb2.CatalogTool]:
    tools: list[connection_pb2.CatalogTool] = []
    token = ""
    while True:
        page = connections.ListCatalogTools(
            connection_service_pb2.ListCatalogToolsRequest(
                tenant=TENANT, name=name, page_token=token
            ),
            timeout=RPC_TIMEOUT_SECONDS,
        )
        tools.extend(page.tools)
        token = page.next_page_token
        if not token:
            return tools


def new_run(channel: grpc.Channel, name: str) -> str:
    """A Run whose Spec grants every tool of every server."""
    spec = spec_pb2.Spec(
        name=name,
        version=1,
        grants=[spec_pb2.ToolGrant(server_pattern="*", tool_pattern="*")],
    )
    spec_service_pb2_grpc.SpecServiceStub(channel).PublishSpec(
        spec_service_pb2.PublishSpecRequest(spec=spec), timeout=RPC_TIMEOUT_SECONDS
    )
    created = run_service_pb2_grpc.RunServiceStub(channel).CreateRun(
        run_service_pb2.CreateRunRequest(tenant=TENANT, spec_name=name, spec_version=1),
        timeout=RPC_TIMEOUT_SECONDS,
    )
    return str(created.run.run_id)


def serves_no_calls(outcome: tool_service_pb2.ToolOutcome) -> bool:
    """Whether the server answered the call with JSON-RPC Method not found: a server that lists
    tools but serves no `tools/call` (a scenario that checks only how its listing is read).
    The sidecar relayed the server's answer as the tool error a model would see; a host has
    nothing more to do with it."""
    return METHOD_NOT_FOUND in outcome.result_json.decode(errors="replace")


class Play:
    """One scenario's connection, and the sign-ins it took."""

    def __init__(self, channel: grpc.Channel, name: str) -> None:
        self.channel = channel
        self.connections = connection_service_pb2_grpc.ConnectionServiceStub(channel)
        self.name = name
        self.sign_ins = 0
        # The arguments the scenario's context gives for a tool (its `toolCalls`), which a
        # call uses instead of sample ones (`http-custom-headers` sends a null this way).
        self.given: dict[str, dict[str, Any]] = {}

    def settle(self) -> connection_pb2.Connection:
        """The connection once settled, signed in as often as it asks and MAX_SIGN_INS allows."""
        connection = wait_until_settled(self.connections, self.name)
        print(f"host: connection {self.name}: {describe(connection)}", file=sys.stderr)
        while (
            connection.state == connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED
            and self.sign_ins < MAX_SIGN_INS
        ):
            self.sign_ins += 1
            if sign_in(self.connections, self.name) is None:
                break
            connection = wait_until_settled(self.connections, self.name)
            print(f"host: connection {self.name}: {describe(connection)}", file=sys.stderr)
        return connection

    def call(
        self, run_id: str, tool: connection_pb2.CatalogTool, call_id: str
    ) -> tool_service_pb2.CallDeferredToolResponse:
        arguments = struct_pb2.Struct()
        arguments.update(self.given.get(tool.name) or sample_arguments(tool.input_schema_json))
        request = tool_service_pb2.CallDeferredToolRequest(
            run_id=run_id, server=self.name, tool=tool.name, arguments=arguments, call_id=call_id
        )
        request.timeout.seconds = CALL_TIMEOUT_SECONDS
        stub = tool_service_pb2_grpc.ToolServiceStub(self.channel)
        response: tool_service_pb2.CallDeferredToolResponse = stub.CallDeferredTool(
            request, timeout=RPC_TIMEOUT_SECONDS
        )
        waiting = response.input_required if response.HasField("input_required") else None
        rounds = 0
        while waiting is not None and rounds < MAX_INPUT_ROUNDS:
            # The server asks its user first: the user accepts each form as offered (the
            # sidecar fills in the schema's defaults) and consents to each URL.
            rounds += 1
            asked = "; ".join(f"{r.key}: {r.message}" for r in waiting.requests)
            print(f"host: {tool.name} asks ({waiting.protocol_version}): {asked}", file=sys.stderr)
            answered = stub.ContinueToolCall(
                tool_service_pb2.ContinueToolCallRequest(
                    run_id=run_id,
                    call_id=waiting.call_id,
                    attempt=waiting.attempt,
                    answers=[
                        tool_service_pb2.InputAnswer(
                            key=r.key, action=tool_service_pb2.INPUT_ACTION_ACCEPT
                        )
                        for r in waiting.requests
                    ],
                ),
                timeout=RPC_TIMEOUT_SECONDS,
            )
            response = tool_service_pb2.CallDeferredToolResponse(outcome=answered.outcome)
            waiting = answered.input_required if answered.HasField("input_required") else None
        outcome = response.outcome
        result = outcome.result_json.decode()[:500]
        print(f"host: {tool.name} -> is_error {outcome.is_error}: {result}", file=sys.stderr)
        return response

    def call_each_tool(self, run_id: str, tools: list[connection_pb2.CatalogTool]) -> bool:
        """Call every tool once; whether every call returned a result that is not an error.
        A call refused because the connection needs authorization (a scope step-up) is made
        again, under a new call id, once the user has signed in again."""
        all_ok = True
        for number, tool in enumerate(tools):
            outcome = self.call(run_id, tool, f"call-{number}").outcome
            attempt = 0
            while outcome.is_error and attempt < MAX_SIGN_INS and self.sign_ins < MAX_SIGN_INS:
                needs = find_connection(self.connections, self.name)
                if needs.state != connection_pb2.CONNECTION_STATE_AUTHORIZATION_REQUIRED:
                    break
                print(f"host: connection {self.name}: {describe(needs)}", file=sys.stderr)
                if self.settle().state != connection_pb2.CONNECTION_STATE_CONNECTED:
                    break
                attempt += 1
                outcome = self.call(run_id, tool, f"call-{number}-again-{attempt}").outcome
            all_ok = all_ok and (not outcome.is_error or serves_no_calls(outcome))
        return all_ok


def play(channel: grpc.Channel, scenario: str, url: str, context: dict[str, Any]) -> bool:
    connections = connection_service_pb2_grpc.ConnectionServiceStub(channel)
    name = connection_name(scenario)
    connection = connection_pb2.Connection(
        tenant=TENANT, name=name, http=http_transport(scenario, url, context)
    )
    connections.PutConnection(
        connection_service_pb2.PutConnectionRequest(connection=connection),
        timeout=RPC_TIMEOUT_SECONDS,
    )
    try:
        current = Play(channel, name)
        current.given = {
            call["name"]: call.get("arguments") or {}
            for call in context.get("toolCalls") or []
            if isinstance(call, dict) and isinstance(call.get("name"), str)
        }
        if current.settle().state != connection_pb2.CONNECTION_STATE_CONNECTED:
            return False
        tools = catalogue(connections, name)
        print(f"host: catalogue: {[tool.name for tool in tools]}", file=sys.stderr)
        if scenario == SCHEMA_ECHO_SCENARIO:
            current.given.update(schema_echo_arguments(tools))
        return current.call_each_tool(new_run(channel, name), tools)
    finally:
        # The scenario's server stops after this run: the sidecar must not keep retrying it.
        connections.DeleteConnection(
            connection_service_pb2.DeleteConnectionRequest(tenant=TENANT, name=name),
            timeout=RPC_TIMEOUT_SECONDS,
        )


def main() -> int:
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    address = os.environ["PSYCH_SIDECAR_ADDRESS"]
    # The runner's context for the scenario (its `name` and, for some, client credentials).
    context: dict[str, Any] = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    if not scenario:
        print("host: MCP_CONFORMANCE_SCENARIO is not set", file=sys.stderr)
        return 2
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT_SECONDS)
        return 0 if play(channel, scenario, url, context) else 1


if __name__ == "__main__":
    sys.exit(main())

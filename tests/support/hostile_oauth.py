"""An OAuth-protected MCP server as a hostile one would be: a real HTTP server on loopback (in
the test's process, on a thread) whose every answer the test sets, for the sign-in's hostile
input tests. Unscripted, it is a working authorization server: its /mcp answers 401 naming its
protected-resource metadata, which names itself as the authorization server, whose metadata
names its /authorize, /token and /register; registration and the token endpoint answer as a
well-behaved server does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The routes a test scripts, each an answer.
CHALLENGE = "challenge"  # POST /mcp (and any other POST): the server's 401
RESOURCE = "resource"  # GET /.well-known/oauth-protected-resource...
SERVER = "server"  # GET /.well-known/oauth-authorization-server... (and openid-configuration)
REGISTER = "register"  # POST /register
TOKEN = "token"  # POST /token
OTHER = "other"  # any other GET (where a redirect may lead)


@dataclass(frozen=True)
class Answer:
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    @classmethod
    def of_json(cls, value: object, status: int = 200) -> Answer:
        text = json.dumps(value, allow_nan=True)
        return cls(status, (("content-type", "application/json"),), text.encode())


@dataclass
class HostileOAuthServer:
    """The server; `answers` (route -> Answer) is what it says next, `requests` what it was
    asked (method and path), both safe to change and read from the test's thread."""

    port: int = 0
    answers: dict[str, Answer] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def well_behaved(self) -> dict[str, Answer]:
        base = self.base
        return {
            CHALLENGE: Answer(
                401,
                (
                    (
                        "www-authenticate",
                        f'Bearer resource_metadata="{base}/.well-known/oauth-protected-resource"',
                    ),
                ),
            ),
            RESOURCE: Answer.of_json({"resource": f"{base}/mcp", "authorization_servers": [base]}),
            SERVER: Answer.of_json(
                {
                    "issuer": base,
                    "authorization_endpoint": f"{base}/authorize",
                    "token_endpoint": f"{base}/token",
                    "registration_endpoint": f"{base}/register",
                    "response_types_supported": ["code"],
                    "code_challenge_methods_supported": ["S256"],
                }
            ),
            REGISTER: Answer.of_json(
                {
                    "client_id": "hostile-client",
                    "client_secret": "hostile-secret",
                    "redirect_uris": ["http://127.0.0.1:9/callback"],
                    "token_endpoint_auth_method": "client_secret_post",
                },
                201,
            ),
            TOKEN: Answer.of_json(
                {"access_token": "hostile-access", "token_type": "Bearer", "expires_in": 3600}
            ),
            OTHER: Answer(404),
        }

    def script(self, **answers: Answer) -> None:
        """Answer as a well-behaved server does, but for the routes given."""
        self.answers = {**self.well_behaved(), **answers}
        self.requests.clear()

    def asked(self, route_prefix: str) -> int:
        return sum(1 for _, path in list(self.requests) if path.startswith(route_prefix))


def _route(method: str, path: str) -> str:
    if method == "POST":
        if path.startswith("/register"):
            return REGISTER
        if path.startswith("/token"):
            return TOKEN
        return CHALLENGE
    if path.startswith("/.well-known/oauth-protected-resource"):
        return RESOURCE
    if path.startswith("/.well-known/"):
        return SERVER
    return OTHER


def _handler(hostile: HostileOAuthServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            hostile.requests.append((self.command, self.path))
            answer = hostile.answers.get(_route(self.command, self.path), Answer(404))
            self.send_response_only(answer.status)
            for name, value in answer.headers:
                self.send_header(name, value)
            self.send_header("content-length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        do_GET = _answer
        do_POST = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def hostile_oauth_server() -> Iterator[HostileOAuthServer]:
    """A generator for a pytest fixture: the server, started on a free loopback port."""
    hostile = HostileOAuthServer()
    http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hostile))
    http.daemon_threads = True
    hostile.port = http.server_address[1]
    hostile.script()
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield hostile
    finally:
        http.shutdown()
        http.server_close()
        thread.join(10)

"""An OAuth-protected MCP test server (streamable HTTP on loopback): authorization server and
resource server in one, built on the MCP SDK's server auth.

    python tests/mcp_servers/oauth_server.py --port P [--token-seconds S]
        [--issuer URL] [--resource URL] [--metadata-padding BYTES] [--metadata-delay SECONDS]
        [--approve-code C] [--step-up-scope S] [--client-id-metadata-documents]
        [--open-initialize] [--refuse-initialize]

- dynamic client registration on; authorization code with PKCE; the consent is automatic, so
  a test plays the user's browser by following the authorization URL to its redirect;
- access tokens live `--token-seconds` (default 4); refresh tokens rotate: each refresh
  spends the one presented and issues a new one;
- `POST /admin/clients` creates a client: {"client_id", "client_secret"} one for the
  client-credentials grant (client_secret_basic or _post); {"client_id", "public_key_pem"} one
  for it with private_key_jwt (the assertion's signature checked with that key, its iss, sub
  and aud); {"client_id", "client_secret", "redirect_uri"} a pre-registered client for the
  authorization code (client_secret_basic);
- `--client-id-metadata-documents`: the authorization server metadata advertises
  client_id_metadata_document_supported, and a client_id that is the URL of a document posted
  to `POST /admin/client-documents` ({"url", "document"}) is that public client. The document
  is posted rather than fetched: its URL must be https, which a loopback test does not serve;
- `GET /admin/token-auth` counts the token requests by the client authentication they carried
  ({"client_secret_basic", "client_secret_post", "private_key_jwt", "none"}); with
  `?client_id=C` only those of client C (other tests' clients may renew meanwhile);
  `GET /admin/presented-codes` lists every authorization code presented to it (exchanged or
  not), in order: whether one code was, whatever else other clients sent;
- `POST /admin/hold-tokens?on=1`: the token endpoint holds every request it receives (reads
  it, answers nothing) until `POST /admin/hold-tokens?on=0` lets them all through;
  `GET /admin/held-tokens?count=N&within=S` answers {"held"} (how many it holds now) once it
  holds N, or after S seconds when it does not;
- `POST /admin/claim-expires-in?seconds=N`: every token response from then on claims
  expires_in N (a hostile or careless number; the tokens still live `--token-seconds`);
- `POST /admin/revoke` forgets every refresh token (and with `?access=1` every access token);
  `POST /admin/refuse-access?on=1` refuses every access token, fresh ones too (`on=0` ends it);
  `GET /admin/stats` answers {"refreshes", "client_credentials", "registrations", "calls",
  "rejected_refreshes"} as counted since start; `GET /admin/tokens` every live access and
  refresh token and registered client secret (to look for them where they must not be);
- `--issuer` advertises another authorization server in the protected-resource metadata (a
  non-allowed address, for the refusal tests); `--resource` names another resource than the
  server in it; `--metadata-padding` pads that metadata to a large size; `--metadata-delay`
  answers it late;
- `POST /admin/iss?mode=M&advertise=A`: the authorization response's `iss` (RFC 9207): M is
  `omit` (the default: none), `correct` (the issuer), `wrong` (another server's) or
  `normalized` (the issuer with a "/" added); A=1 advertises
  authorization_response_iss_parameter_supported in the authorization server metadata;
- `POST /admin/authorization-server?url=U`: the protected-resource metadata names U (another
  instance of this server) as the authorization server instead of this one, and /mcp then takes
  only U's access tokens (asked of U at `GET /admin/token-check?token=T`, which answers
  {"valid", "scopes"}), refusing this server's own with 401 (`url=` ends it); this server's
  authorization server still answers;
- `--step-up-scope S`: S is a scope of the server too (a registered client may ask for any of
  the server's scopes); after `POST /admin/require-scope?on=1` a request to /mcp whose token
  lacks S is refused 403 insufficient_scope naming S (`on=0` ends it); with `&method=M` only
  requests of JSON-RPC method M are (`tools/list`, `tools/call`...);
- `--open-initialize`: an `initialize` without a token is answered (statelessly, by this
  server), as are notifications; any other /mcp request without one is refused 401 with a
  challenge naming every scope of the server, so a client learns the scope it needs only
  from a request after initialize;
- `--refuse-initialize`: an `initialize` without a token is refused 400, as a server of the
  2026-07-28 revision alone (no handshake) refuses it, while other requests without one are
  refused 401 with the challenge of `--open-initialize` (with which it goes);
- `POST /admin/echo-token?on=1`: every /mcp request with a token is refused 403 with a
  WWW-Authenticate that echoes the token it refused (`on=0` ends it);
  `POST /admin/next-access-token` with {"token"}: the next access token issued is that one
  (a canary: it may hold CR/LF, which no HTTP header may carry);
- `--approve-code CODE`: the token endpoint also takes CODE as an authorization code for any
  registered client, as if its user had consented (the contract runners speak gRPC only and
  cannot play the browser);
- tools: `echo` (answers its text) and `calls` (how many tool calls ran).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import secrets
import sys
import time
import urllib.parse
from collections import Counter, defaultdict
from typing import Any

import httpx2 as httpx
import jwt
import uvicorn
from mcp.server.auth.json_response import PydanticJSONResponse
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    OAuthAuthorizationServerProvider,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.routes import build_metadata
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


class MemoryProvider(
    OAuthAuthorizationServerProvider[AuthorizationCode, RefreshToken, AccessToken]
):
    """An OAuthAuthorizationServerProvider holding everything in memory. It keeps the
    protocol's exchange_identity_assertion, which refuses the grant (never called: AuthSettings
    leaves identity_assertion_enabled off)."""

    def __init__(self, token_seconds: int, scopes: list[str]) -> None:
        self.token_seconds = token_seconds
        self.scopes = scopes
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        # Client ID metadata documents by their URL (--client-id-metadata-documents).
        self.documents: dict[str, dict[str, Any]] = {}
        # Set by POST /admin/refuse-access: every access token is refused, fresh ones too.
        self.refuse_access = False
        # Set by POST /admin/iss: what `iss` the authorization response carries, and the
        # issuer it is checked against (the published one).
        self.iss_mode = "omit"
        self.issuer = ""
        # Set by POST /admin/next-access-token: the next access token issued.
        self.next_access = ""
        # Set by POST /admin/claim-expires-in: what token responses claim as expires_in.
        self.claimed_expires_in: int | None = None
        self.stats = {
            "refreshes": 0,
            "rejected_refreshes": 0,
            "client_credentials": 0,
            "registrations": 0,
            "calls": 0,
        }

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        document = self.documents.get(client_id)
        if document is not None and document.get("client_id") == client_id:
            # A client ID metadata document's client: public, its redirect URIs the document's.
            return OAuthClientInformationFull(
                client_id=client_id,
                redirect_uris=document["redirect_uris"],
                token_endpoint_auth_method="none",
                scope=" ".join(self.scopes),
            )
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        # Any of the server's scopes, so that a sign-in may step up to one it lacks.
        client_info.scope = " ".join(self.scopes)
        self.clients[client_info.client_id] = client_info
        self.stats["registrations"] += 1

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        # The user consents at once: the redirect carries the code.
        code = secrets.token_urlsafe(24)
        assert client.client_id is not None
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or ["mcp"],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        iss = {
            "omit": None,
            "correct": self.issuer,
            "wrong": "https://evil.example.com",
            "normalized": self.issuer + "/",
        }[self.iss_mode]
        return construct_redirect_uri(
            str(params.redirect_uri), code=code, state=params.state, iss=iss
        )

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, self.next_access = self.next_access or secrets.token_urlsafe(24), ""
        refresh = secrets.token_urlsafe(24)
        expires = int(time.time()) + self.token_seconds
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource
        )
        return OAuthToken(
            access_token=access,
            expires_in=self.claimed_expires_in or self.token_seconds,
            scope=" ".join(scopes),
            refresh_token=refresh,
        )

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        assert client.client_id is not None
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        found = self.refresh.get(refresh_token)
        if found is None:
            self.stats["rejected_refreshes"] += 1
        return found

    async def exchange_refresh_token(
        self,
        client: OAuthClientInformationFull,
        refresh_token: RefreshToken,
        scopes: list[str],
    ) -> OAuthToken:
        # Rotation: the presented refresh token is spent.
        if self.refresh.pop(refresh_token.token, None) is None:
            self.stats["rejected_refreshes"] += 1
            raise TokenError("invalid_grant", "refresh token already used")
        self.stats["refreshes"] += 1
        assert client.client_id is not None
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        if self.refuse_access:
            return None
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)


async def read_body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        chunk: bytes = message.get("body", b"")
        body += chunk
        if not message.get("more_body"):
            return body


def replay_of(body: bytes, receive: Any) -> Any:
    """An ASGI receive that gives the body already read, then what `receive` gives."""
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()  # type: ignore[no-any-return]
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def build_app(options: argparse.Namespace) -> Any:
    base = f"http://127.0.0.1:{options.port}"
    scopes = ["mcp", *([options.step_up_scope] if options.step_up_scope else [])]
    provider = MemoryProvider(options.token_seconds, scopes)
    registration = ClientRegistrationOptions(
        enabled=True, valid_scopes=scopes, default_scopes=["mcp"]
    )
    revocation = RevocationOptions(enabled=True)
    # The URLs as strings, which AuthSettings validates keeping a path-less issuer without a
    # trailing slash (an AnyHttpUrl made beforehand would carry one).
    auth = AuthSettings.model_validate(
        {
            "issuer_url": base,
            "resource_server_url": f"{base}/mcp",
            "validate_token_resource": False,
            "client_registration_options": registration,
            "revocation_options": revocation,
            "required_scopes": ["mcp"],
        }
    )
    server: MCPServer[Any] = MCPServer(
        "psych-oauth", version="1.0.0", auth_server_provider=provider, auth=auth
    )
    server_metadata = build_metadata(auth.issuer_url, None, registration, revocation)
    provider.issuer = str(server_metadata.issuer)
    if options.client_id_metadata_documents:
        server_metadata.client_id_metadata_document_supported = True
    # Set by POST /admin/iss?advertise=: the metadata is then served by the app below.
    iss_advertised: bool | None = None
    # Set by POST /admin/authorization-server: the authorization server the protected-resource
    # metadata names instead of this one, and the access tokens of it seen valid.
    delegate = ""
    delegated: set[str] = set()

    @server.tool()
    def echo(text: str) -> str:
        """Answers its text."""
        provider.stats["calls"] += 1
        return text

    @server.tool()
    def calls() -> str:
        """How many tool calls ran."""
        return str(provider.stats["calls"])

    inner = server.streamable_http_app()
    client_secrets: dict[str, str] = {}
    client_keys: dict[str, str] = {}
    auth_methods = ("client_secret_basic", "client_secret_post", "private_key_jwt", "none")
    # Token requests per client, per client authentication method.
    token_auth: dict[str, Counter[str]] = defaultdict(Counter)
    presented_codes: list[str] = []
    # Set by POST /admin/require-scope: the step-up scope every /mcp request's token needs
    # (only those of `scoped_method`, when set).
    required_scope = ""
    scoped_method = ""
    # Set by POST /admin/echo-token: every /mcp request with a token is refused, echoing it.
    echo_token = False
    # Cleared by POST /admin/hold-tokens?on=1: token requests wait for it; `held` counts them.
    tokens_flow = asyncio.Event()
    tokens_flow.set()
    held = 0
    held_changed = asyncio.Condition()

    async def hold_token_request() -> None:
        nonlocal held
        async with held_changed:
            held += 1
            held_changed.notify_all()
        try:
            await tokens_flow.wait()
        finally:
            async with held_changed:
                held -= 1
                held_changed.notify_all()

    async def held_tokens(count: int, within: float) -> int:
        async with held_changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(held_changed.wait_for(lambda: held >= count), within)
            return held

    async def admin(request: Request) -> Response:
        nonlocal required_scope, iss_advertised, delegate, scoped_method, echo_token
        if request.url.path == "/admin/iss":
            provider.iss_mode = request.query_params.get("mode", "omit")
            iss_advertised = request.query_params.get("advertise") == "1"
            return JSONResponse({"mode": provider.iss_mode, "advertised": iss_advertised})
        if request.url.path == "/admin/authorization-server":
            delegate = request.query_params.get("url", "")
            delegated.clear()
            return JSONResponse({"authorization_server": delegate or base})
        if request.url.path == "/admin/token-check":
            found = await provider.load_access_token(request.query_params.get("token", ""))
            return JSONResponse(
                {"valid": found is not None, "scopes": [] if found is None else found.scopes}
            )
        if request.url.path == "/admin/stats":
            return JSONResponse(provider.stats)
        if request.url.path == "/admin/client-documents":
            body = await request.json()
            provider.documents[body["url"]] = body["document"]
            return JSONResponse({"created": body["url"]})
        if request.url.path == "/admin/token-auth":
            client_id = request.query_params.get("client_id")
            clients = list(token_auth.values())
            if client_id is not None:
                clients = [token_auth.get(client_id, Counter())]
            return JSONResponse(
                {method: sum(counts[method] for counts in clients) for method in auth_methods}
            )
        if request.url.path == "/admin/presented-codes":
            return JSONResponse(presented_codes)
        if request.url.path == "/admin/require-scope":
            on = request.query_params.get("on") == "1"
            required_scope = options.step_up_scope if on else ""
            scoped_method = request.query_params.get("method", "")
            return JSONResponse({"required_scope": required_scope})
        if request.url.path == "/admin/echo-token":
            echo_token = request.query_params.get("on") == "1"
            return JSONResponse({"echo_token": echo_token})
        if request.url.path == "/admin/next-access-token":
            provider.next_access = (await request.json())["token"]
            return JSONResponse({"next": True})
        if request.url.path == "/admin/hold-tokens":
            if request.query_params.get("on") == "1":
                tokens_flow.clear()
            else:
                tokens_flow.set()
            return JSONResponse({"holding": not tokens_flow.is_set()})
        if request.url.path == "/admin/held-tokens":
            count = int(request.query_params["count"])
            within = float(request.query_params["within"])
            return JSONResponse({"held": await held_tokens(count, within)})
        if request.url.path == "/admin/tokens":
            secrets_issued = [
                *provider.access,
                *provider.refresh,
                *(c.client_secret for c in provider.clients.values() if c.client_secret),
            ]
            return JSONResponse({"secrets": secrets_issued})
        if request.url.path == "/admin/refuse-access":
            provider.refuse_access = request.query_params.get("on") == "1"
            return JSONResponse({"refuse_access": provider.refuse_access})
        if request.url.path == "/admin/claim-expires-in":
            provider.claimed_expires_in = int(request.query_params["seconds"])
            return JSONResponse({"claimed_expires_in": provider.claimed_expires_in})
        if request.url.path == "/admin/revoke":
            provider.refresh.clear()
            if request.query_params.get("access"):
                provider.access.clear()
            return JSONResponse({"revoked": True})
        if request.url.path == "/admin/clients":
            body = await request.json()
            if "redirect_uri" in body:
                provider.clients[body["client_id"]] = OAuthClientInformationFull(
                    client_id=body["client_id"],
                    client_secret=body["client_secret"],
                    redirect_uris=[body["redirect_uri"]],
                    token_endpoint_auth_method="client_secret_basic",
                    scope=" ".join(scopes),
                )
            elif "public_key_pem" in body:
                client_keys[body["client_id"]] = body["public_key_pem"]
            else:
                client_secrets[body["client_id"]] = body["client_secret"]
            return JSONResponse({"created": body["client_id"]})
        return Response(status_code=404)

    async def delegated_token(scope: dict[str, Any]) -> bool:
        """Whether a /mcp request carries an access token of the delegate authorization server
        (then taken as this server's own, so that the MCP server accepts it)."""
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        bearer = headers.get("authorization", "").removeprefix("Bearer ")
        if not bearer:
            return True  # the MCP server's own 401 answers it
        if bearer in delegated:
            return True
        async with httpx.AsyncClient(timeout=10) as client:
            answer = (
                await client.get(f"{delegate}/admin/token-check", params={"token": bearer})
            ).json()
        if not answer["valid"]:
            return False
        delegated.add(bearer)
        provider.access[bearer] = AccessToken(
            token=bearer,
            client_id="delegated",
            scopes=answer["scopes"],
            expires_at=int(time.time()) + 3600,
        )
        return True

    def auth_method(form: dict[str, str], authorization: str) -> str:
        if authorization.lower().startswith("basic "):
            return "client_secret_basic"
        if form.get("client_assertion_type") == JWT_BEARER:
            return "private_key_jwt"
        return "client_secret_post" if form.get("client_secret") else "none"

    def assertion_client(form: dict[str, str]) -> str | None:
        """The client a private-key JWT assertion authenticates: signed by its key, issued by
        and about it, for this server (RFC 7523 §3); None when it does not."""
        client_id = form.get("client_id", "")
        key = client_keys.get(client_id)
        if key is None:
            return None
        try:
            claims = jwt.decode(
                form.get("client_assertion", ""),
                key,
                algorithms=["RS256", "ES256"],
                audience=[base, f"{base}/", f"{base}/token"],
                options={"require": ["iss", "sub", "aud", "exp"]},
            )
        except jwt.InvalidTokenError:
            return None
        return client_id if claims["iss"] == claims["sub"] == client_id else None

    def client_and_secret(form: dict[str, str], authorization: str) -> tuple[str, str]:
        """The client id and secret a token request presents: in its Basic authorization
        (RFC 6749 §2.3.1, form-encoded) or its form."""
        if authorization.lower().startswith("basic "):
            pair = base64.b64decode(authorization[6:]).decode()
            client_id, _, secret = pair.partition(":")
            return urllib.parse.unquote(client_id), urllib.parse.unquote(secret)
        return form.get("client_id", ""), form.get("client_secret", "")

    def client_credentials(form: dict[str, str], authorization: str) -> Response:
        if form.get("client_assertion_type") == JWT_BEARER:
            signed = assertion_client(form)
            if signed is None:
                return JSONResponse({"error": "invalid_client"}, status_code=401)
            return issue_client_credentials(signed, form)
        client_id, secret = client_and_secret(form, authorization)
        if client_secrets.get(client_id) != secret or not secret:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        return issue_client_credentials(client_id, form)

    def issue_client_credentials(client_id: str, form: dict[str, str]) -> Response:
        provider.stats["client_credentials"] += 1
        token = provider._issue(client_id, ["mcp"], form.get("resource"))
        token.refresh_token = None
        return JSONResponse(token.model_dump(exclude_none=True))

    def guard_mcp(scope: dict[str, Any], body: bytes) -> Response | None:
        """The refusal (or the stateless initialize) this server's knobs make of an /mcp
        request; None: the SDK's server answers it."""
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        try:
            message = json.loads(body) if body else {}
        except ValueError:
            message = {}
        method = message.get("method", "") if isinstance(message, dict) else ""
        authorization = headers.get("authorization", "")
        metadata = f"{base}/.well-known/oauth-protected-resource/mcp"
        if options.open_initialize and not authorization:
            if method == "initialize" and options.refuse_initialize:
                return JSONResponse({"error": "unsupported protocol version"}, status_code=400)
            if method == "initialize":
                return JSONResponse(
                    {
                        "jsonrpc": "2.0",
                        "id": message.get("id"),
                        "result": {
                            "protocolVersion": message["params"]["protocolVersion"],
                            "capabilities": {"tools": {}},
                            "serverInfo": {"name": "psych-oauth", "version": "1.0.0"},
                        },
                    }
                )
            if method.startswith("notifications/"):
                return Response(status_code=202)
            challenge = (
                f'Bearer error="invalid_token", scope="{" ".join(scopes)}", '
                f'resource_metadata="{metadata}"'
            )
            return JSONResponse(
                {"error": "invalid_token"}, status_code=401, headers={"WWW-Authenticate": challenge}
            )
        bearer = authorization.removeprefix("Bearer ")
        if echo_token and bearer:
            challenge = f'Bearer error="invalid_token", error_description="{bearer} is refused"'
            return JSONResponse(
                {"error": "invalid_token"}, status_code=403, headers={"WWW-Authenticate": challenge}
            )
        held = provider.access.get(bearer)
        if (
            required_scope
            and held is not None
            and required_scope not in held.scopes
            and (not scoped_method or method == scoped_method)
        ):
            challenge = (
                f'Bearer error="insufficient_scope", scope="{required_scope}", '
                f'resource_metadata="{metadata}"'
            )
            return JSONResponse(
                {"error": "insufficient_scope"},
                status_code=403,
                headers={"WWW-Authenticate": challenge},
            )
        return None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith("/admin/"):
            answer = await admin(Request(scope, receive))
            await answer(scope, receive, send)
            return
        if (
            scope["type"] == "http"
            and path.startswith("/mcp")
            and delegate
            and not await delegated_token(scope)
        ):
            challenge = (
                'Bearer error="invalid_token", '
                f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"'
            )
            refusal = JSONResponse(
                {"error": "invalid_token"},
                status_code=401,
                headers={"WWW-Authenticate": challenge},
            )
            await refusal(scope, receive, send)
            return
        if scope["type"] == "http" and path.startswith("/mcp"):
            body = await read_body(receive)
            guarded = guard_mcp(scope, body)
            if guarded is not None:
                await guarded(scope, receive, send)
                return
            await inner(scope, replay_of(body, receive), send)
            return
        if (
            scope["type"] == "http"
            and path == "/.well-known/oauth-authorization-server"
            and (options.client_id_metadata_documents or iss_advertised is not None)
        ):
            served = server_metadata.model_copy(
                update={"authorization_response_iss_parameter_supported": iss_advertised}
            )
            await PydanticJSONResponse(served)(scope, receive, send)
            return
        if scope["type"] == "http" and path.startswith("/.well-known/oauth-protected-resource"):
            if options.metadata_delay:
                await asyncio.sleep(options.metadata_delay)
            if options.issuer or options.resource or options.metadata_padding or delegate:
                metadata = {
                    "resource": options.resource or f"{base}/mcp",
                    "authorization_servers": [delegate or options.issuer or base],
                    "scopes_supported": ["mcp"],
                    "padding": "x" * options.metadata_padding,
                }
                await JSONResponse(metadata)(scope, receive, send)
                return
        if scope["type"] == "http" and path == "/token" and scope["method"] == "POST":
            body = await read_body(receive)
            if not tokens_flow.is_set():
                await hold_token_request()
            form = dict(urllib.parse.parse_qsl(body.decode()))
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            authorization = headers.get("authorization", "")
            client_id = client_and_secret(form, authorization)[0]
            token_auth[client_id][auth_method(form, authorization)] += 1
            if form.get("grant_type") == "authorization_code":
                presented_codes.append(form.get("code", ""))
            if (
                options.approve_code
                and form.get("grant_type") == "authorization_code"
                and form.get("code") == options.approve_code
                and form.get("client_id") in provider.clients
            ):
                # The user's consent, stood in for: the contract runners speak gRPC only.
                token = provider._issue(form["client_id"], ["mcp"], form.get("resource"))
                await JSONResponse(token.model_dump(exclude_none=True))(scope, receive, send)
                return
            if form.get("grant_type") == "client_credentials":
                await client_credentials(form, authorization)(scope, receive, send)
                return
            await inner(scope, replay_of(body, receive), send)
            return
        await inner(scope, receive, send)

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-seconds", type=int, default=4)
    parser.add_argument("--issuer", default="")
    parser.add_argument("--resource", default="")
    parser.add_argument("--metadata-padding", type=int, default=0)
    parser.add_argument("--metadata-delay", type=float, default=0.0)
    parser.add_argument("--approve-code", default="")
    parser.add_argument("--step-up-scope", default="")
    parser.add_argument("--client-id-metadata-documents", action="store_true")
    parser.add_argument("--open-initialize", action="store_true")
    parser.add_argument("--refuse-initialize", action="store_true")
    options = parser.parse_args()
    config = uvicorn.Config(
        build_app(options), host="127.0.0.1", port=options.port, log_level="warning"
    )
    print(f"listening on {options.port}", file=sys.stderr, flush=True)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()

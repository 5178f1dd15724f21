"""How an HTTP connection authenticates with OAuth, and the sign-in's records.

Two OAuth cases besides static headers: the authorization code on a user's behalf (the host
signs its user in with two calls, BeginSignIn and CompleteSignIn) and client credentials. A
connection's OAuth secrets (client secret, private key) and everything the sign-in yields
(tokens, the registered client, the PKCE verifier) are secrets: never returned, never logged,
sealed at rest by storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from psych_sidecar.domain.errors import (
    ConnectionAuthorizationRequired,
    SignInNotApplicable,
    short,
)


class AuthKind(StrEnum):
    STATIC_HEADERS = "static_headers"
    AUTHORIZATION_CODE = "oauth_authorization_code"
    CLIENT_CREDENTIALS = "oauth_client_credentials"


class ClientKind(StrEnum):
    """Which OAuth client an authorization-code connection signs in as."""

    DYNAMIC_REGISTRATION = "dynamic_registration"
    REGISTERED = "registered_client"
    METADATA_URL = "client_metadata_url"


class AuthorizationReason(StrEnum):
    """Why a connection needs authorizing (its state is AUTHORIZATION_REQUIRED)."""

    NEVER_SIGNED_IN = "never_signed_in"
    REFRESH_REFUSED = "refresh_refused"
    SCOPE_MISSING = "scope_missing"
    CREDENTIALS_REFUSED = "credentials_refused"


@dataclass(frozen=True, slots=True)
class OAuthSettings:
    """A connection's OAuth configuration. `client_secret` and `private_key_pem` are secrets
    (their repr is suppressed); the rest may be shown."""

    kind: AuthKind
    # Authorization code: which client, and the redirect URI the host owns.
    client_kind: ClientKind = ClientKind.DYNAMIC_REGISTRATION
    client_name: str = ""
    client_metadata_url: str = ""
    redirect_uri: str = ""
    # Both OAuth cases.
    client_id: str = ""
    client_secret: str = field(default="", repr=False)
    scopes: tuple[str, ...] = ()
    # Client credentials.
    private_key_pem: str = field(default="", repr=False)
    algorithm: str = ""
    resource: str = ""
    issuer: str = ""

    def without_secrets(self) -> OAuthSettings:
        return OAuthSettings(
            kind=self.kind,
            client_kind=self.client_kind,
            client_name=self.client_name,
            client_metadata_url=self.client_metadata_url,
            redirect_uri=self.redirect_uri,
            client_id=self.client_id,
            scopes=self.scopes,
            algorithm=self.algorithm if self.private_key_pem else "",
            resource=self.resource,
            issuer=self.issuer,
            private_key_pem="",
            client_secret="",
        )

    @property
    def uses_private_key(self) -> bool:
        return bool(self.private_key_pem)

    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.client_secret, self.private_key_pem) if s)


@dataclass(frozen=True, slots=True)
class OAuthGrant:
    """What a connection holds from its authorization server, as stored: the tokens (secret),
    the client the sidecar signed in as (its secret too), and the discovered metadata (JSON
    as the SDK models dump it). `revision` is the connection's revision it was granted to."""

    revision: int
    tokens_json: str = field(repr=False)
    client_json: str = field(repr=False)
    metadata_json: str
    # When the access token expires; None when the server gave no lifetime.
    expire_time: datetime | None
    # Set when the tokens are no longer usable and the user must authorize again.
    authorization_reason: AuthorizationReason | None = None


@dataclass(frozen=True, slots=True)
class RefreshClaim:
    """What asking to refresh a grant found: the grant as stored, and either the refresh
    claim, taken for the asker (`claimed`: it asks the token endpoint, then stores the result
    while the claim is still its own), or another's live claim on it (`held_elsewhere`: the
    asker waits and asks again). Neither: the grant needs no refresh (it was just renewed)."""

    grant: OAuthGrant
    claimed: bool = False
    held_elsewhere: bool = False


@dataclass(frozen=True, slots=True)
class PendingSignIn:
    """A begun sign-in, waiting for its code. The state is stored as its digest only; the
    verifier and the client are secrets."""

    state_digest: str
    tenant: str
    name: str
    revision: int
    expire_time: datetime
    verifier: str = field(repr=False)
    client_json: str = field(repr=False)
    metadata_json: str
    scope: str
    resource: str
    # When it was spent (completed or failed); None while it waits.
    used_time: datetime | None = None


def sign_in_not_applicable(name: str, kind: AuthKind | None) -> SignInNotApplicable:
    auth = kind.value if kind is not None else "none (stdio)"
    return SignInNotApplicable(
        f"connection {short(name)!r} does not sign in with the OAuth authorization code "
        f"(its auth is {auth}); a sign-in needs oauth_authorization_code",
        connection=short(name),
        auth=auth,
    )


def connection_authorization_required(
    name: str, reason: AuthorizationReason
) -> ConnectionAuthorizationRequired:
    return ConnectionAuthorizationRequired(
        f"connection {short(name)!r} needs authorizing first ({reason.value.replace('_', ' ')})",
        connection=short(name),
        reason_name=reason.name,
    )


def authorization_line(server: str, reason: AuthorizationReason) -> str:
    """What the model is told of a server that needs authorizing: in its prompt line and as
    the tool error of a call to it. At most 200 characters (the name is cut to 64)."""
    if reason is AuthorizationReason.CREDENTIALS_REFUSED:
        return (
            f"{short(server)} needs re-authorizing: its server refused the sidecar's "
            "credentials. Its tools fail until an operator fixes them."
        )
    if reason is AuthorizationReason.NEVER_SIGNED_IN:
        return (
            f"{short(server)} needs the user to sign in; nobody has yet, and its tools fail "
            "until they do. Tell the user if they need it."
        )
    return (
        f"{short(server)} needs the user to sign in again; its tools fail until they do. "
        "Tell the user if they need it."
    )

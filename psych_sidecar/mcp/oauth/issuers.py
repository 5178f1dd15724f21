"""Which authorization server a client's credentials may go to, and whether an authorization
response came from the one the sign-in began with (RFC 9207). An MCP server names the
authorization server in its metadata, and is untrusted: a registered client's secret, a private
key or a dynamically registered client goes to the issuer it is bound to and no other
(docs/security.md, *Credentials and their issuer*). Issuers are compared as exact strings, as
the authorization server's metadata spelled them (`Discovery.issuer`)."""

from __future__ import annotations

from mcp.shared.auth import OAuthClientInformationFull

from psych_sidecar.domain.catalog import AuthKind, ClientKind, Connection, OAuthGrant, OAuthSettings
from psych_sidecar.domain.errors import OAuthIssuerMismatch, SignInIssuerMismatch, short
from psych_sidecar.mcp.oauth.discovery import Discovery


def grant_issuer(grant: OAuthGrant | None) -> str:
    """The issuer of the authorization server a grant came from, as its metadata spelled it;
    "" without a grant."""
    return "" if grant is None else Discovery.from_json(grant.metadata_json).issuer


def uses_own_credentials(auth: OAuthSettings) -> bool:
    """Whether the connection's configuration holds the client's credentials (a registered
    client, client credentials), as opposed to a client the sidecar registered itself or a
    client metadata document URL."""
    return auth.kind is AuthKind.CLIENT_CREDENTIALS or auth.client_kind is ClientKind.REGISTERED


def bound_issuer(
    auth: OAuthSettings, client: OAuthClientInformationFull | None, granted_by: str
) -> str:
    """The issuer a client's credentials may go to; "" while they are bound to none yet. The
    connection's own client: its configured issuer, else the one its grant came from
    (`granted_by`; trust on first use, docs/security.md). A dynamically registered client: the
    one it was registered at. A client metadata document's: none (it is public, made for any
    authorization server)."""
    if uses_own_credentials(auth):
        return auth.issuer or granted_by
    return (client.issuer or "") if client is not None else ""


def check_bound(connection: Connection, bound: str, discovery: Discovery) -> None:
    """Refuse to use `discovery`'s authorization server for credentials bound to another
    ("" bound: not bound yet, anything goes)."""
    if bound and discovery.issuer != bound:
        raise OAuthIssuerMismatch(
            f"connection {short(connection.name)!r}: its client's credentials are bound to "
            f"the authorization server {short(bound, 200)}, but the server names "
            f"{short(discovery.issuer, 200)}; nothing was sent there",
            connection=short(connection.name),
            bound_issuer=short(bound, 200),
            named_issuer=short(discovery.issuer, 200),
        )


def check_response_issuer(connection: Connection, discovery: Discovery, iss: str | None) -> None:
    """RFC 9207: an authorization response's `iss` (None: it had none) is the issuer of the
    authorization server the sign-in began with, compared as strings; it may be missing only
    when that server does not advertise authorization_response_iss_parameter_supported."""
    advertised = discovery.server_metadata.authorization_response_iss_parameter_supported
    if iss == discovery.issuer or (iss is None and not advertised):
        return
    said = (
        f"has no iss, which {short(discovery.issuer, 200)!r} says it sends (a host passes "
        "the redirect's iss to CompleteSignIn)"
        if iss is None
        else f"came from {short(iss, 200)!r}, not from {short(discovery.issuer, 200)!r}"
    )
    raise SignInIssuerMismatch(
        f"connection {short(connection.name)!r}: the authorization response {said}; the code "
        "was not used, begin again",
        tenant=short(connection.tenant),
        connection=short(connection.name),
        issuer=short(discovery.issuer, 200),
        iss=short(iss or "", 200),
    )

"""OAuth for HTTP connections: sign-in over two calls, client credentials, tokens kept fresh.

In five modules, one job each: `guard` (the outbound address guard every request goes
through), `discovery` (what a server and its authorization server publish), `issuers` (which
authorization server a client's credentials may go to, and the authorization response's `iss`),
`flows` (the sign-in, registration, refresh and client-credentials requests), `grants` (a
session's tokens kept fresh, and the bearer auth of its HTTP client).

Built from the MCP SDK's auth client pieces (`mcp.client.auth.utils`: the RFC 9728 and
RFC 8414 discovery URLs and response handling, client registration, scope selection; its
`PKCEParameters`; its `OAuthToken`, `OAuthMetadata`, `OAuthClientInformationFull` models; the
private-key JWT assertion of its client-credentials extension). Not its `OAuthClientProvider`:
that provider runs a whole sign-in inside one HTTP request of one process (it awaits the
browser's redirect in between) and refreshes tokens with no coordination between processes.
Here a sign-in spans two RPCs, possibly on two sidecars, so its state lives sealed in the
database; and a refresh claims the grant in a short transaction before its token request (no
lock held over the request), so that with many sidecars on one database a rotating refresh
token is spent once (docs/security.md).

Every request this package sends (discovery, registration, token) goes through `OutboundGuard`:
https only (plain http to loopback only when the operator allows it), addresses the operator
allowed, bounded redirects, response size and time. Tokens never leave through an error, a log
line or a reply: errors quote OAuth error codes and descriptions, scrubbed.
"""

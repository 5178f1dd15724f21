"""ConnectionService: protobuf in, use case, protobuf out. Secrets are read, never written."""

from __future__ import annotations

from typing import Any

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    connection_service_pb2_grpc,
)
from psych_sidecar.api.convert import RESPONSE_HEADROOM_BYTES, by_proto_name, timestamp
from psych_sidecar.api.plumbing import Context
from psych_sidecar.api.turns import STATES
from psych_sidecar.domain.catalog import (
    AuthKind,
    AuthorizationReason,
    CatalogTool,
    ClientKind,
    Connection,
    ConnectionService,
    ConnectionStatus,
    OAuthSettings,
    TransportKind,
    redact_url,
)
from psych_sidecar.domain.errors import field_invalid, field_required

# Why a connection needs authorizing, as the protobuf enum: a connection's, and a tool outcome's.
AUTHORIZATION_REASONS = by_proto_name(
    AuthorizationReason,
    connection_pb2.AuthorizationRequiredReason,
    "AUTHORIZATION_REQUIRED_REASON_",
)


def auth_from_proto(http: connection_pb2.HttpTransport) -> OAuthSettings | None:
    case = http.WhichOneof("auth")
    if case == "oauth_authorization_code":
        code = http.oauth_authorization_code
        client = code.WhichOneof("client")
        if client is None:
            raise field_required("connection.http.oauth_authorization_code.client")
        return OAuthSettings(
            kind=AuthKind.AUTHORIZATION_CODE,
            scopes=tuple(code.scopes),
            redirect_uri=code.redirect_uri,
            client_kind=ClientKind(client),
            client_id=code.registered_client.client_id,
            client_secret=code.registered_client.client_secret,
            issuer=code.registered_client.issuer,
            client_metadata_url=code.client_metadata_url,
            client_name=code.dynamic_registration.client_name,
        )
    if case == "oauth_client_credentials":
        credentials = http.oauth_client_credentials
        credential = credentials.WhichOneof("credential")
        if credential is None:
            raise field_required("connection.http.oauth_client_credentials.credential")
        return OAuthSettings(
            kind=AuthKind.CLIENT_CREDENTIALS,
            client_id=credentials.client_id,
            client_secret=credentials.client_secret,
            private_key_pem=credentials.private_key_jwt.private_key_pem,
            algorithm=credentials.private_key_jwt.algorithm,
            scopes=tuple(credentials.scopes),
            resource=credentials.resource,
            issuer=credentials.issuer,
        )
    return None


def _auth_to_proto(auth: OAuthSettings | None, http: connection_pb2.HttpTransport) -> None:
    """The auth without its secrets (client secret, private key)."""
    if auth is None or auth.kind is AuthKind.STATIC_HEADERS:
        return
    if auth.kind is AuthKind.CLIENT_CREDENTIALS:
        http.oauth_client_credentials.client_id = auth.client_id
        http.oauth_client_credentials.scopes.extend(auth.scopes)
        http.oauth_client_credentials.resource = auth.resource
        http.oauth_client_credentials.issuer = auth.issuer
        return
    code = http.oauth_authorization_code
    code.scopes.extend(auth.scopes)
    code.redirect_uri = auth.redirect_uri
    if auth.client_kind is ClientKind.REGISTERED:
        code.registered_client.client_id = auth.client_id
        code.registered_client.issuer = auth.issuer
    elif auth.client_kind is ClientKind.METADATA_URL:
        code.client_metadata_url = auth.client_metadata_url
    else:
        code.dynamic_registration.client_name = auth.client_name


_HTTP_PROTOCOLS = {
    connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP: TransportKind.STREAMABLE_HTTP,
    connection_pb2.HTTP_PROTOCOL_SSE: TransportKind.SSE,
}


def connection_from_proto(message: connection_pb2.Connection) -> Connection:
    common: dict[str, Any] = {
        "tenant": message.tenant,
        "name": message.name,
        "preload": message.preload if message.HasField("preload") else None,
        "eager_tools": tuple(message.eager_tools),
        "description": message.description,
        "allow_tools": tuple(message.allow_tools),
        "deny_tools": tuple(message.deny_tools),
    }
    transport = message.WhichOneof("transport")
    if transport == "stdio":
        return Connection(
            transport=TransportKind.STDIO,
            command=message.stdio.command,
            args=tuple(message.stdio.args),
            env=dict(message.stdio.env),
            **common,
        )
    if transport == "http":
        protocol = _HTTP_PROTOCOLS.get(message.http.protocol)
        if protocol is None:
            raise field_invalid("connection.http.protocol", "say which: STREAMABLE_HTTP or SSE")
        return Connection(
            transport=protocol,
            url=message.http.url,
            headers=dict(message.http.headers),
            auth=auth_from_proto(message.http),
            **common,
        )
    raise field_required("connection.transport")


def connection_to_proto(
    connection: Connection, status: ConnectionStatus
) -> connection_pb2.Connection:
    """Secrets (env, headers) are never written, whatever the domain object holds."""
    message = connection_pb2.Connection(
        tenant=connection.tenant,
        name=connection.name,
        eager_tools=connection.eager_tools,
        description=connection.description,
        allow_tools=connection.allow_tools,
        deny_tools=connection.deny_tools,
        state=STATES[status.state],
        last_error=status.last_error,
        state_time=timestamp(status.state_time),
        catalog_version=status.catalog_version,
        recent_output=status.recent_output,
        rejected_tools=[
            connection_pb2.RejectedTool(name=item.name, reason=item.reason)
            for item in status.rejected.tools
        ],
        rejected_tool_count=status.rejected.count,
    )
    if status.authorization_reason is not None:
        message.authorization_required_reason = AUTHORIZATION_REASONS[status.authorization_reason]
    if status.token_expire_time is not None:
        message.token_expire_time.CopyFrom(timestamp(status.token_expire_time))
    if connection.preload is not None:
        message.preload = connection.preload
    if connection.transport is TransportKind.STDIO:
        message.stdio.command = connection.command
        message.stdio.args.extend(connection.args)
    else:
        # Redacted again here, whatever the caller passed: user-info and query values are
        # secrets (the domain's without_secrets already did; this is idempotent).
        message.http.url = redact_url(connection.url)
        message.http.protocol = (
            connection_pb2.HTTP_PROTOCOL_SSE
            if connection.transport is TransportKind.SSE
            else connection_pb2.HTTP_PROTOCOL_STREAMABLE_HTTP
        )
        _auth_to_proto(connection.auth, message.http)
    return message


def catalog_tool_to_proto(tool: CatalogTool) -> connection_pb2.CatalogTool:
    return connection_pb2.CatalogTool(
        server=tool.server,
        name=tool.name,
        description=tool.description,
        input_schema_json=tool.input_schema_json,
        output_schema_json=tool.output_schema_json,
        annotations_json=tool.annotations_json,
        catalog_version=tool.catalog_version,
        removed_in_version=tool.removed_in_version,
    )


class ConnectionServicer(connection_service_pb2_grpc.ConnectionServiceServicer):
    def __init__(self, connections: ConnectionService, max_message_bytes: int) -> None:
        self._connections = connections
        self._page_bytes = max(max_message_bytes - RESPONSE_HEADROOM_BYTES, 1)

    async def PutConnection(
        self, request: connection_service_pb2.PutConnectionRequest, context: Context
    ) -> connection_service_pb2.PutConnectionResponse:
        if not request.HasField("connection"):
            raise field_required("connection")
        connection, status = await self._connections.put(connection_from_proto(request.connection))
        return connection_service_pb2.PutConnectionResponse(
            connection=connection_to_proto(connection, status)
        )

    async def DeleteConnection(
        self, request: connection_service_pb2.DeleteConnectionRequest, context: Context
    ) -> connection_service_pb2.DeleteConnectionResponse:
        await self._connections.delete(request.tenant, request.name)
        return connection_service_pb2.DeleteConnectionResponse()

    async def ListConnections(
        self, request: connection_service_pb2.ListConnectionsRequest, context: Context
    ) -> connection_service_pb2.ListConnectionsResponse:
        listed, next_token = await self._connections.list_connections(
            request.tenant, request.page_size, request.page_token
        )
        return connection_service_pb2.ListConnectionsResponse(
            connections=[connection_to_proto(c, s) for c, s in listed],
            next_page_token=next_token,
        )

    async def BeginSignIn(
        self, request: connection_service_pb2.BeginSignInRequest, context: Context
    ) -> connection_service_pb2.BeginSignInResponse:
        url, state, expire_time = await self._connections.begin_sign_in(
            request.tenant, request.name
        )
        return connection_service_pb2.BeginSignInResponse(
            authorization_url=url, state=state, expire_time=timestamp(expire_time)
        )

    async def CompleteSignIn(
        self, request: connection_service_pb2.CompleteSignInRequest, context: Context
    ) -> connection_service_pb2.CompleteSignInResponse:
        connection, status = await self._connections.complete_sign_in(
            request.tenant,
            request.state,
            request.code,
            request.name,
            iss=request.iss if request.HasField("iss") else None,
        )
        return connection_service_pb2.CompleteSignInResponse(
            connection=connection_to_proto(connection, status)
        )

    async def RefreshCatalog(
        self, request: connection_service_pb2.RefreshCatalogRequest, context: Context
    ) -> connection_service_pb2.RefreshCatalogResponse:
        write = await self._connections.refresh(request.tenant, request.name)
        return connection_service_pb2.RefreshCatalogResponse(
            catalog_version=write.catalog_version,
            tool_count=write.tool_count,
            rejected_tool_count=write.rejected_count,
        )

    async def ListCatalogTools(
        self, request: connection_service_pb2.ListCatalogToolsRequest, context: Context
    ) -> connection_service_pb2.ListCatalogToolsResponse:
        tools, next_token = await self._connections.list_tools(
            request.tenant,
            request.name,
            request.catalog_version,
            request.page_size,
            request.page_token,
            self._page_bytes,
        )
        return connection_service_pb2.ListCatalogToolsResponse(
            tools=[catalog_tool_to_proto(tool) for tool in tools], next_page_token=next_token
        )

    async def DiffCatalog(
        self, request: connection_service_pb2.DiffCatalogRequest, context: Context
    ) -> connection_service_pb2.DiffCatalogResponse:
        diff = await self._connections.diff(
            request.tenant, request.name, request.from_version, request.to_version
        )
        return connection_service_pb2.DiffCatalogResponse(
            added=[catalog_tool_to_proto(tool) for tool in diff.added],
            changed=[catalog_tool_to_proto(tool) for tool in diff.changed],
            removed=[catalog_tool_to_proto(tool) for tool in diff.removed],
        )

    async def ListCatalogVersions(
        self, request: connection_service_pb2.ListCatalogVersionsRequest, context: Context
    ) -> connection_service_pb2.ListCatalogVersionsResponse:
        versions, next_token = await self._connections.list_versions(
            request.tenant, request.name, request.page_size, request.page_token
        )
        return connection_service_pb2.ListCatalogVersionsResponse(
            versions=[
                connection_pb2.CatalogVersion(
                    catalog_version=version.catalog_version,
                    tool_count=version.tool_count,
                    sha256=version.sha256,
                    create_time=timestamp(version.create_time),
                    rejected_tool_count=version.rejected_count,
                )
                for version in versions
            ],
            next_page_token=next_token,
        )

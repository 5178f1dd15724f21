"""Rules for connections and their versioned catalogues.

The catalogue is a versioned, soft-delete table: a refresh writes every tool it saw at a new
version and marks every older current tool removed as of that version; nothing is ever
hard-deleted, so any version reads back and two versions diff cheaply.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from psych_sidecar.domain.catalog.connections import (
    NO_REJECTIONS,
    CatalogTool,
    Connection,
    RejectedTool,
    Rejections,
    TransportKind,
)
from psych_sidecar.domain.catalog.oauth import AuthKind, ClientKind
from psych_sidecar.domain.catalog.urls import http_url_problem
from psych_sidecar.domain.errors import (
    CatalogVersionNotFound,
    CommandNotAllowed,
    ConnectionNotFound,
    field_invalid,
    field_required,
    quoted,
    short,
)
from psych_sidecar.domain.runlog import validate_name

CONNECTION_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
HEADER_NAME_PATTERN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
MAX_ARGUMENT_LENGTH = 4096
MAX_DESCRIPTION_LENGTH = 8192
MAX_TOOL_PATTERN_LENGTH = 1024
# A listed tool the catalogue keeps: a name of at most this many printable characters (MCP's
# advice for tool names), and a definition (name, description, schemas, annotations) of at
# most this many bytes: a server's listing is untrusted, and every catalogue version, surface
# and search index holds it.
MAX_TOOL_NAME_CHARS = 128
MAX_TOOL_DEFINITION_BYTES = 256 * 1024
# Of a listing's rejected tools, the first this many are kept with their reasons (a server
# listing a million invalid tools must not make a catalogue version that large); the count
# is always kept.
MAX_REJECTED_TOOLS_KEPT = 100
MAX_REJECTION_REASON_CHARS = 300


# Variables that make a loader, an interpreter or a shell run code of the caller's choosing,
# or change which program runs: a connection may set one only if the operator's entry names
# it exactly (a prefix like "LD_*" or "*" in allowed_env does not count).
_RISKY_ENV_PREFIXES = (
    "LD_",
    "DYLD_",
    "PYTHON",
    "NODE_",
    "NPM_CONFIG_",
    "PERL",
    "RUBY",
    "JAVA_",
    "_JAVA_",
    "JDK_JAVA_",
    "GCONV_",
    "MALLOC_",
    "GLIBC_",
    "BASH_",
    "GIT_",
)
_RISKY_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "SHELL",
        "ENV",
        "IFS",
        "CDPATH",
        "SHELLOPTS",
        "PS4",
        "TMPDIR",
        "CLASSPATH",
        "GOFLAGS",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "RES_OPTIONS",
        "NLSPATH",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "UV_INDEX_URL",
        "PIP_INDEX_URL",
    }
)


def risky_env_name(name: str) -> bool:
    """Whether an environment name can change what code the process runs or whom it trusts."""
    upper = name.upper()
    return upper in _RISKY_ENV_NAMES or upper.startswith(_RISKY_ENV_PREFIXES)


def env_name_allowed(name: str, allowed_env: Sequence[str]) -> bool:
    """Whether a connection may set `name`: listed exactly, or (unless risky) under a prefix
    entry ending in '*'."""
    if name in allowed_env:
        return True
    if risky_env_name(name):
        return False
    return any(entry.endswith("*") and name.startswith(entry[:-1]) for entry in allowed_env)


@dataclass(frozen=True, slots=True)
class AllowedCommand:
    """An operator-allowed stdio command, as the domain sees it: the API may only name it."""

    allow_extra_args: bool
    # The env names a connection may set (see env_name_allowed); empty: none.
    allowed_env: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoredConnection:
    """A connection as stored, secrets included: for the MCP layer only, never for a reply."""

    connection: Connection
    # Bumped by every put; a session knows from it whether it runs the current config.
    revision: int
    catalog_version: int
    update_time: datetime
    # What the listing of `catalog_version` left out.
    rejected: Rejections = NO_REJECTIONS


@dataclass(frozen=True, slots=True)
class CatalogWrite:
    """The outcome of recording one complete listing."""

    catalog_version: int
    tool_count: int
    # False when the listing equalled the current version, which then stays current.
    changed: bool
    # How many listed tools were left out (invalid definitions).
    rejected_count: int = 0


@dataclass(frozen=True, slots=True)
class CatalogVersion:
    """One stored version of a connection's catalogue."""

    catalog_version: int
    tool_count: int
    # SHA-256 of the listing (listing_fingerprint), lowercase hex.
    sha256: str
    create_time: datetime
    # How many listed tools were left out of the version (invalid definitions): a version
    # with no tools and rejected ones had a listing that was entirely invalid.
    rejected_count: int = 0


@dataclass(frozen=True, slots=True)
class CatalogDiff:
    added: tuple[CatalogTool, ...]
    changed: tuple[CatalogTool, ...]
    removed: tuple[CatalogTool, ...]


def connection_not_found(tenant: str, name: str) -> ConnectionNotFound:
    return ConnectionNotFound(
        f"no connection {quoted(name)} for tenant {quoted(tenant)}",
        tenant=short(tenant),
        connection=short(name),
    )


def catalog_version_not_found(name: str, version: int) -> CatalogVersionNotFound:
    return CatalogVersionNotFound(
        f"connection {quoted(name)} has no catalogue version {version}",
        connection=short(name),
        catalog_version=version,
    )


def validate_connection_name(value: str, field_path: str) -> None:
    if not value:
        raise field_required(field_path)
    if not CONNECTION_NAME_PATTERN.fullmatch(value):
        raise field_invalid(field_path, "must be 1-64 characters of [A-Za-z0-9._-]")


def validate_connection(
    connection: Connection, allowed_commands: Mapping[str, AllowedCommand]
) -> None:
    """Refuse a connection that could never work, or that names a command the operator did
    not allow. Field paths are those of PutConnectionRequest."""
    validate_name(connection.tenant, "connection.tenant")
    validate_connection_name(connection.name, "connection.name")
    if connection.transport is TransportKind.STDIO:
        _validate_stdio(connection, allowed_commands)
    else:
        _validate_url(connection.url, "connection.http.url")
        _validate_headers(connection.headers)
        if connection.auth is not None:
            _validate_oauth(connection)
    if len(connection.description) > MAX_DESCRIPTION_LENGTH:
        raise field_invalid(
            "connection.description", f"longer than {MAX_DESCRIPTION_LENGTH} characters"
        )
    for field_name in ("eager_tools", "allow_tools", "deny_tools"):
        for index, value in enumerate(getattr(connection, field_name)):
            path = f"connection.{field_name}[{index}]"
            if not value:
                raise field_required(path)
            if len(value) > MAX_TOOL_PATTERN_LENGTH or "\x00" in value:
                raise field_invalid(
                    path, f"must be at most {MAX_TOOL_PATTERN_LENGTH} characters, without NUL"
                )


def _validate_stdio(connection: Connection, allowed_commands: Mapping[str, AllowedCommand]) -> None:
    if not connection.command:
        raise field_required("connection.stdio.command")
    allowed = allowed_commands.get(connection.command)
    if allowed is None:
        raise CommandNotAllowed(
            f"command {quoted(connection.command)} is not one the operator allowed in the "
            "sidecar's configuration (mcp_commands)",
            command=short(connection.command),
        )
    if connection.args and not allowed.allow_extra_args:
        raise field_invalid(
            "connection.stdio.args",
            f"the operator's entry for {quoted(connection.command)} takes no extra arguments",
        )
    for index, argument in enumerate(connection.args):
        if len(argument) > MAX_ARGUMENT_LENGTH or "\x00" in argument:
            raise field_invalid(
                f"connection.stdio.args[{index}]",
                f"must be at most {MAX_ARGUMENT_LENGTH} characters, without NUL",
            )
    _validate_strings(connection.env, "connection.stdio.env")
    for name in sorted(connection.env):
        if not env_name_allowed(name, allowed.allowed_env):
            shown = quoted(name)
            raise CommandNotAllowed(
                f"connection.stdio.env may not set {shown}: the operator's entry for "
                f"{quoted(connection.command)} does not allow it (mcp_commands allowed_env)",
                command=short(connection.command),
                env=short(name),
            )


def _validate_url(url: str, field_path: str) -> None:
    # The parser every URL of a connection meets again later (the sign-in's requests, the
    # SDK's URL type), so what passes here does not fail there.
    if not url:
        raise field_required(field_path)
    problem = http_url_problem(url)
    if problem:
        raise field_invalid(field_path, f"must be an http:// or https:// URL: {problem}")


def _validate_strings(values: Mapping[str, str], field_path: str) -> None:
    # Keys are named in errors, values never: they are secrets.
    for key, value in values.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise field_invalid(
                f"{field_path}[{quoted(key)}]",
                "names must be non-empty without '=' or NUL; values without NUL",
            )


def _validate_headers(headers: Mapping[str, str]) -> None:
    # Refused here rather than by the HTTP client later, whose error would quote the value.
    for name, value in headers.items():
        if not HEADER_NAME_PATTERN.fullmatch(name) or any(c in value for c in "\r\n\x00"):
            raise field_invalid(
                f"connection.http.headers[{quoted(name)}]",
                "names must be HTTP tokens; values must not hold CR, LF or NUL",
            )


_OAUTH_TEXT_LIMIT = 2048
_PRIVATE_KEY_LIMIT = 16384


def _validate_oauth(connection: Connection) -> None:
    auth = connection.auth
    assert auth is not None
    if auth.kind is AuthKind.STATIC_HEADERS:
        return
    if any(name.lower() == "authorization" for name in connection.headers):
        raise field_invalid(
            "connection.http.headers",
            "with OAuth the sidecar sets the authorization header itself",
        )
    base = f"connection.http.{auth.kind.value}"
    issuer_field = (
        "registered_client.issuer" if auth.kind is AuthKind.AUTHORIZATION_CODE else "issuer"
    )
    texts = {
        "client_id": auth.client_id,
        "client_secret": auth.client_secret,
        "client_name": auth.client_name,
        "resource": auth.resource,
        issuer_field: auth.issuer,
        "redirect_uri": auth.redirect_uri,
        **{f"scopes[{index}]": scope for index, scope in enumerate(auth.scopes)},
    }
    for name, value in texts.items():
        if len(value) > _OAUTH_TEXT_LIMIT or any(c in value for c in "\r\n\x00"):
            raise field_invalid(
                f"{base}.{name}",
                f"at most {_OAUTH_TEXT_LIMIT} characters, without CR, LF or NUL",
            )
    for index, scope in enumerate(auth.scopes):
        if not scope or " " in scope:
            raise field_invalid(f"{base}.scopes[{index}]", "one scope, without spaces")
    if auth.kind is AuthKind.AUTHORIZATION_CODE:
        _validate_url(auth.redirect_uri, f"{base}.redirect_uri")
        if auth.client_kind is ClientKind.REGISTERED and not auth.client_id:
            raise field_required(f"{base}.registered_client.client_id")
        if auth.issuer:
            _validate_url(auth.issuer, f"{base}.registered_client.issuer")
        if auth.client_kind is ClientKind.METADATA_URL and (
            not re.fullmatch(r"https://[^\s/?#]+/[^\s]+", auth.client_metadata_url)
            or http_url_problem(auth.client_metadata_url)
        ):
            raise field_invalid(
                f"{base}.client_metadata_url", "must be an https:// URL with a path other than /"
            )
        if len(auth.client_name) > 100:
            raise field_invalid(
                f"{base}.dynamic_registration.client_name", "at most 100 characters"
            )
        return
    if not auth.client_id:
        raise field_required(f"{base}.client_id")
    if not auth.client_secret and not auth.private_key_pem:
        raise field_required(f"{base}.credential")
    if auth.private_key_pem and (
        len(auth.private_key_pem) > _PRIVATE_KEY_LIMIT or "PRIVATE KEY" not in auth.private_key_pem
    ):
        raise field_invalid(f"{base}.private_key_jwt.private_key_pem", "not a PEM private key")
    if auth.algorithm and not re.fullmatch(r"(RS|PS|ES)(256|384|512)|EdDSA", auth.algorithm):
        raise field_invalid(
            f"{base}.private_key_jwt.algorithm", "one of RS*, PS*, ES* (256/384/512) or EdDSA"
        )
    if auth.resource:
        _validate_url(auth.resource, f"{base}.resource")
    if auth.issuer:
        _validate_url(auth.issuer, f"{base}.issuer")


def tool_definition_problem(tool: CatalogTool) -> str:
    """Why a listed tool cannot go into the catalogue; "" when it can."""
    if not tool.name or len(tool.name) > MAX_TOOL_NAME_CHARS or not tool.name.isprintable():
        return f"the name must be 1-{MAX_TOOL_NAME_CHARS} printable characters"
    size = (
        len(tool.name.encode())
        + len(tool.description.encode())
        + len(tool.input_schema_json)
        + len(tool.output_schema_json)
        + len(tool.annotations_json)
    )
    if size > MAX_TOOL_DEFINITION_BYTES:
        return f"the definition is {size} bytes, more than the {MAX_TOOL_DEFINITION_BYTES} allowed"
    try:
        schema = json.loads(tool.input_schema_json)
    except ValueError:
        return "the input schema is not JSON"
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return 'the input schema is not an object schema (its top-level "type" must be "object")'
    return ""


def rejected_tool(name: object, reason: str) -> RejectedTool:
    """A rejection as kept: the name (if the entry had a string one) and the reason, cut."""
    shown = name[:MAX_TOOL_NAME_CHARS] if isinstance(name, str) else ""
    # A lone surrogate (JSON allows "\ud800") cannot be stored or sent: replaced.
    shown = shown.encode(errors="replace").decode()
    return RejectedTool(shown, reason[:MAX_REJECTION_REASON_CHARS])


def rejections(rejected: Sequence[RejectedTool]) -> Rejections:
    """A listing's rejections as a version keeps them: the first few by name, and the count."""
    ordered = sorted(rejected, key=lambda r: (r.name, r.reason))
    return Rejections(tuple(ordered[:MAX_REJECTED_TOOLS_KEPT]), len(rejected))


def listing_fingerprint(tools: Sequence[CatalogTool], rejected: Rejections = NO_REJECTIONS) -> str:
    """A digest of a listing's content, independent of the order the server sent it in. The
    rejected tools count: a listing whose only change is a tool's rejection (or its reason) is
    a new version, so the version's rejections are always those of the listing it holds."""
    digest = hashlib.sha256()
    for tool in sorted(tools, key=lambda t: t.name):
        for value in (
            tool.name.encode(),
            tool.description.encode(),
            tool.input_schema_json,
            tool.output_schema_json,
            tool.annotations_json,
        ):
            digest.update(struct.pack(">Q", len(value)))
            digest.update(value)
    if rejected.count:
        # After the tools, marked, so that no listing without rejections changes its digest.
        digest.update(b"rejected" + struct.pack(">Q", rejected.count))
        for item in sorted(rejected.tools, key=lambda r: (r.name, r.reason)):
            for text in (item.name, item.reason):
                value = text.encode()
                digest.update(struct.pack(">Q", len(value)))
                digest.update(value)
    return digest.hexdigest()


def diff_catalog(older: Sequence[CatalogTool], newer: Sequence[CatalogTool]) -> CatalogDiff:
    """Added and changed tools as of the newer version; removed ones as of the older."""
    before = {tool.name: tool for tool in older}
    after = {tool.name: tool for tool in newer}
    return CatalogDiff(
        added=tuple(after[name] for name in sorted(after.keys() - before.keys())),
        changed=tuple(
            after[name]
            for name in sorted(after.keys() & before.keys())
            if _content(after[name]) != _content(before[name])
        ),
        removed=tuple(before[name] for name in sorted(before.keys() - after.keys())),
    )


def _content(tool: CatalogTool) -> tuple[str, bytes, bytes, bytes]:
    return (
        tool.description,
        tool.input_schema_json,
        tool.output_schema_json,
        tool.annotations_json,
    )

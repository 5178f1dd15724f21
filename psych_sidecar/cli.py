"""psych-sidecar serve | migrate | rekey | health | prune | delete-tenant | inspect | version.

Every setting of `Settings` is a flag of each command that reads the settings (all but inspect
and version; `--data-dir` for `data_dir`),
generated from the model under its flat key (`SETTING_KEYS`), so a setting reads the same from a
flag, the environment (PSYCH_SIDECAR_DATA_DIR) and the TOML file (`data_dir = …`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Literal, get_args, get_origin

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from psych_sidecar import __version__, inspect_command
from psych_sidecar.config import (
    CONFIG_FILE_ENV,
    ENV_PREFIX,
    SETTING_KEYS,
    Settings,
    load_settings,
    parse_listen_address,
)
from psych_sidecar.storage.engines import normalize_url
from psych_sidecar.telemetry import logs


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from error


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, generated from the model: `--data-dir` for `data_dir`.

    A list setting takes its flag once per item (`--listen A --listen B`), a true/false one is
    `--x` / `--no-x`, a table (`mcp_commands`) takes JSON, as in the environment. The value
    is validated by the model, exactly as from the file or the environment.
    """
    group = parser.add_argument_group(
        "settings (a flag beats the environment, which beats the file)"
    )
    for name, setting in SETTING_KEYS.items():
        field = setting.field
        environment = ENV_PREFIX + name.upper()
        shown = field.default if str(field.default) != "" else '""'
        default = "" if field.default_factory is not None else f"; default {shown}"
        help_text = f"{field.description} [{environment}{default}]".replace("%", "%%")
        # --listen ADDR, --data-dir DIR, --max-message-bytes BYTES, --…-seconds SECONDS
        metavar = {"LISTEN": "ADDR"}.get(word := name.rsplit("_", 1)[-1].upper(), word)
        kind = get_origin(field.annotation) or field.annotation
        if kind is bool:
            group.add_argument(
                _flag(name), dest=name, action=argparse.BooleanOptionalAction, help=help_text
            )
        elif kind is list:
            group.add_argument(
                _flag(name), dest=name, action="append", metavar=metavar, help=help_text
            )
        elif kind is dict:
            group.add_argument(
                _flag(name), dest=name, type=_json_value, metavar="JSON", help=help_text
            )
        elif kind is Literal:
            group.add_argument(
                _flag(name), dest=name, choices=get_args(field.annotation), help=help_text
            )
        else:
            group.add_argument(_flag(name), dest=name, metavar=metavar, help=help_text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="psych-sidecar",
        description="Tool disclosure and prompt-budget sidecar for LLM agent hosts.",
        epilog="Every setting is a flag of each command but inspect and version, an environment "
        f"variable ({ENV_PREFIX}<NAME>) and a key of the TOML file; see docs/operations.md.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    settings = argparse.ArgumentParser(add_help=False)
    settings.add_argument(
        "--config", metavar="FILE", help=f"TOML settings file [{CONFIG_FILE_ENV}]"
    )
    add_settings_flags(settings)
    commands.add_parser("serve", parents=[settings], help="run the gRPC server")
    commands.add_parser("migrate", parents=[settings], help="apply database migrations and exit")
    commands.add_parser(
        "rekey",
        parents=[settings],
        help="seal every stored secret under the first key (safe while sidecars serve)",
    )
    check = commands.add_parser(
        "health",
        parents=[settings],
        help="exit 0 if the sidecar at ADDR reports SERVING, 1 otherwise (for probes)",
    )
    check.add_argument(
        "--address",
        default=None,
        help="unix:///path or HOST:PORT (default: the first listen address of the settings)",
    )
    check.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for an answer")
    prune = commands.add_parser(
        "prune",
        parents=[settings],
        help="delete the Runs older than an age, then give the space back (safe while "
        "sidecars serve)",
    )
    prune.add_argument(
        "--older-than",
        metavar="DURATION",
        default=None,
        help="e.g. 30d, 12h, 45m (default: run_retention_hours, when set)",
    )
    forget = commands.add_parser(
        "delete-tenant",
        parents=[settings],
        help="delete every Run, connection, catalogue, OAuth grant and sealed secret of a tenant",
    )
    forget.add_argument("tenant", metavar="TENANT")
    inspect_command.add_parser(commands)
    commands.add_parser("version", help="print the version")
    return parser


def settings_from_arguments(argv: list[str]) -> Settings:
    """The settings a command line gives, with the environment and the file it names."""
    return _settings(_parser().parse_args(argv))


def _settings(arguments: argparse.Namespace) -> Settings:
    flags = {name: getattr(arguments, name) for name in SETTING_KEYS}
    return load_settings(arguments.config, **flags)


def _one_line(error: Exception) -> str:
    """A configuration or start-up error as one line: each invalid field, or the first line."""
    if isinstance(error, ValidationError):
        return "; ".join(
            f"{'.'.join(str(part) for part in _as_keyed(problem['loc'])) or 'settings'}: "
            f"{problem['msg']}"
            for problem in error.errors()
        )
    # A database driver's message (SQLAlchemy wraps it, adding the statement and a link).
    cause = getattr(error, "orig", None) or error
    return str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__


def _as_keyed(location: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """An invalid value's place as the operator wrote it: under its flat key, not the group
    it is kept in (`max_message_bytes`, not `listeners.max_message_bytes`)."""
    if len(location) > 1 and location[0] in Settings.model_fields and location[1] in SETTING_KEYS:
        return location[1:]
    return location


def _fail(message: str, status: int) -> int:
    print(f"psych-sidecar: {message}", file=sys.stderr)
    return status


def _health(arguments: argparse.Namespace) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        if arguments.address:
            target = parse_listen_address(arguments.address).grpc_target
        else:
            target = _settings(arguments).listen_addresses()[0].grpc_target
    except (ValidationError, ValueError) as error:
        return _fail(f"invalid configuration: {_one_line(error)}", 2)
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=arguments.timeout
            )
        except grpc.RpcError as error:
            print(f"{target}: {error.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(f"{target}: {status}")
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else 1


def _migrate(settings: Settings) -> None:
    from psych_sidecar.app.secret_keys import load_secret_keys
    from psych_sidecar.storage.engines import create_database_engine
    from psych_sidecar.storage.migrate import current_revision, migrate, schema_name

    keys = load_secret_keys(settings)
    engine = create_database_engine(
        settings.resolved_migration_database_url(),
        pool_size=1,
        busy_timeout_seconds=settings.storage.database_busy_timeout_seconds,
        # A separate migration URL is the server's own (docs/operations.md, PgBouncer).
        pooling="session"
        if settings.storage.migration_database_url
        else settings.storage.database_pooling,
    )
    try:
        migrate(engine, keys)
        print(f"database at schema {schema_name(current_revision(engine))}")
    finally:
        engine.dispose()


@contextmanager
def _database_at_schema(settings: Settings) -> Iterator[Engine]:
    """One connection to the database, refused unless its schema is this version's, disposed
    on the way out: what the maintenance commands (rekey, prune, delete-tenant) work on."""
    from psych_sidecar.listeners import StartupError
    from psych_sidecar.storage.engines import create_database_engine
    from psych_sidecar.storage.migrate import DatabaseRefused, check_revision

    engine = create_database_engine(
        settings.resolved_database_url(),
        pool_size=1,
        busy_timeout_seconds=settings.storage.database_busy_timeout_seconds,
        pooling=settings.storage.database_pooling,
    )
    try:
        try:
            check_revision(engine)
        except DatabaseRefused as error:
            raise StartupError(str(error)) from None
        yield engine
    finally:
        engine.dispose()


def _rekey(settings: Settings) -> None:
    """Reseal every stored secret under the first key; the schema must be this version's."""
    from psych_sidecar.app.secret_keys import check_stored_secrets, load_secret_keys
    from psych_sidecar.storage.connections import SqlConnectionStore

    keys = load_secret_keys(settings)
    with _database_at_schema(settings) as engine:
        store = SqlConnectionStore(engine, keys)
        # Every secret must open before any is rewritten: a missing key stops it here.
        check_stored_secrets(store)
        resealed, already = store.reseal_secrets()
        print(
            f"{resealed} stored secrets resealed under key {keys.primary_id}, {already} already "
            "were; keys no longer listed first can now be removed"
        )


def _delete_data(arguments: argparse.Namespace, settings: Settings) -> int:
    """`prune` and `delete-tenant`, on a database at this version's schema."""
    from psych_sidecar.app.retention import delete_tenant, parse_duration, prune
    from psych_sidecar.domain.errors import SidecarError
    from psych_sidecar.domain.runlog import RunDeletion, RunService
    from psych_sidecar.storage.deletion import RunDeletions
    from psych_sidecar.storage.repository import SqlStore

    if arguments.command == "prune":
        hours = settings.storage.run_retention_hours
        if arguments.older_than is None and not hours:
            return _fail("prune needs --older-than (or run_retention_hours)", 2)
        try:
            older_than = (
                parse_duration(arguments.older_than)
                if arguments.older_than is not None
                else timedelta(hours=hours)
            )
        except ValueError as error:
            return _fail(f"--older-than: {error}", 2)
    with _database_at_schema(settings) as engine:
        store = SqlStore(engine)
        deletion = RunDeletion(RunService(store, runs=store), RunDeletions(engine))
        if arguments.command == "prune":
            print(prune(deletion, engine, older_than))
        else:
            try:
                print(delete_tenant(deletion, engine, arguments.tenant))
            except SidecarError as error:
                return _fail(str(error), 2)
    return 0


def _inspect(arguments: argparse.Namespace) -> int:
    """Exit 2 for a bad address or database URL, a missing SQLite file or a schema revision
    this version does not know; 1 when the source refused a read or cannot be reached."""
    if arguments.database_url is not None:
        return _inspect_database(arguments)
    from psych_sidecar.inspect_command.remote import GrpcSource

    try:
        address = arguments.address
        target = (
            parse_listen_address(address).grpc_target
            if address
            else load_settings().listen_addresses()[0].grpc_target
        )
    except (ValidationError, ValueError) as error:
        print(f"psych-sidecar: invalid configuration: {error}", file=sys.stderr)
        return 2
    source = GrpcSource(target, arguments.timeout)
    try:
        return inspect_command.run(arguments, source)
    finally:
        source.close()


def _inspect_database(arguments: argparse.Namespace) -> int:
    from psych_sidecar.inspect_command.database import DatabaseSource
    from psych_sidecar.storage.migrate import DatabaseRefused

    try:
        where = normalize_url(arguments.database_url).render_as_string(hide_password=True)
        source = DatabaseSource(arguments.database_url, arguments.timeout)
    except (ValueError, ArgumentError) as error:
        return _fail(f"invalid database URL: {_one_line(error)}", 2)
    except DatabaseRefused as error:
        return _fail(str(error), 2)
    except SQLAlchemyError as error:
        return _fail(f"cannot use the database {where}: {_one_line(error)}", 1)
    try:
        return inspect_command.run(arguments, source)
    except SQLAlchemyError as error:
        return _fail(f"cannot use the database {where}: {_one_line(error)}", 1)
    finally:
        source.close()


def main(argv: list[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    if arguments.command != "serve":
        # Off while the modules loaded (psych_sidecar.launch); serve turns it on once serving.
        gc.enable()
    if arguments.command == "version":
        print(__version__)
        return 0
    if arguments.command == "health":
        return _health(arguments)
    if arguments.command == "inspect":
        return _inspect(arguments)
    try:
        settings = _settings(arguments)
        settings.listen_addresses()
        database = normalize_url(settings.resolved_database_url())
    except (ValidationError, ValueError, ArgumentError) as error:
        return _fail(f"invalid configuration: {_one_line(error)}", 2)
    logs.configure(settings.telemetry.log_level, settings.telemetry.log_format)
    # Alembic narrates every plugin it loads and names each upgrade by its revision id at
    # INFO; the migrations' environment logs each applied migration by name instead.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)
    if arguments.command == "serve":
        from psych_sidecar.app import process

        process.before_threads(settings)
    from psych_sidecar.app.sidecar import StartupError, serve

    # Expected reasons not to start are one line and exit 1; anything else is a bug and
    # keeps its traceback.
    try:
        if arguments.command == "migrate":
            _migrate(settings)
        elif arguments.command == "rekey":
            _rekey(settings)
        elif arguments.command in ("prune", "delete-tenant"):
            return _delete_data(arguments, settings)
        else:
            asyncio.run(serve(settings))
    except StartupError as error:
        return _fail(str(error), 1)
    except SQLAlchemyError as error:
        where = database.render_as_string(hide_password=True)
        return _fail(f"cannot use the database {where}: {_one_line(error)}", 1)
    except OSError as error:
        return _fail(f"cannot start: {error}", 1)
    return 0

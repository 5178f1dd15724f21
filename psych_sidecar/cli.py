"""psych-sidecar serve | migrate | health | inspect | version."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from pydantic import ValidationError

from psych_sidecar import __version__, inspect
from psych_sidecar.config import Settings, load_settings, parse_listen_address
from psych_sidecar.storage.db import normalize_url
from psych_sidecar.telemetry import logs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="psych-sidecar",
        description="Tool disclosure and prompt-budget sidecar for LLM agent hosts.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML settings file (also PSYCH_SIDECAR_CONFIG_FILE)")
    common.add_argument("--database-url", help="sqlite:///path or postgresql://user@host/db")
    common.add_argument("--data-dir", help="directory for the default socket and SQLite file")
    serve = commands.add_parser("serve", parents=[common], help="run the gRPC server")
    serve.add_argument(
        "--listen",
        action="append",
        metavar="ADDR",
        help="unix:///path or HOST:PORT; repeat for several (default: DATA_DIR/sidecar.sock)",
    )
    serve.add_argument(
        "--health-listen",
        action="append",
        metavar="ADDR",
        help="serve only grpc.health.v1 here too (a probe port on the pod IP, say)",
    )
    serve.add_argument(
        "--admin-listen",
        action="append",
        metavar="ADDR",
        help="serve the admin HTTP listener (/metrics) on HOST:PORT; repeat for several",
    )
    serve.add_argument("--log-format", choices=["text", "json"], help="text (default) or json")
    serve.add_argument("--tracing", choices=["off", "otlp"], help="OpenTelemetry export")
    serve.add_argument("--max-message-bytes", type=int, help="largest request or response")
    serve.add_argument(
        "--allow-non-loopback", action="store_true", default=None, help="allow non-loopback TCP"
    )
    commands.add_parser("migrate", parents=[common], help="apply database migrations and exit")
    check = commands.add_parser(
        "health", help="exit 0 if the sidecar at ADDR reports SERVING, 1 otherwise (for probes)"
    )
    check.add_argument(
        "--address",
        default=None,
        help="unix:///path or HOST:PORT (default: the first listen address of the settings)",
    )
    check.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for an answer")
    inspect.add_parser(commands)
    commands.add_parser("version", help="print the version")
    return parser


def _settings(arguments: argparse.Namespace) -> Settings:
    return load_settings(
        arguments.config,
        database_url=arguments.database_url,
        data_dir=arguments.data_dir,
        listen=getattr(arguments, "listen", None),
        max_message_bytes=getattr(arguments, "max_message_bytes", None),
        health_listen=getattr(arguments, "health_listen", None),
        admin_listen=getattr(arguments, "admin_listen", None),
        log_format=getattr(arguments, "log_format", None),
        tracing=getattr(arguments, "tracing", None),
        allow_non_loopback=getattr(arguments, "allow_non_loopback", None),
    )


def _health(address: str | None, timeout: float) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        target = parse_listen_address(address).grpc_target if address else None
        if target is None:
            target = load_settings().listen_addresses()[0].grpc_target
    except (ValidationError, ValueError) as error:
        print(f"psych-sidecar: invalid configuration: {error}", file=sys.stderr)
        return 2
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
        except grpc.RpcError as error:
            print(f"{target}: {error.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(f"{target}: {status}")
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else 1


def _inspect(arguments: argparse.Namespace) -> int:
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
    return inspect.run(arguments, target)


def main(argv: list[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    if arguments.command == "version":
        print(__version__)
        return 0
    if arguments.command == "health":
        return _health(arguments.address, arguments.timeout)
    if arguments.command == "inspect":
        return _inspect(arguments)
    try:
        settings = _settings(arguments)
        settings.listen_addresses()
        normalize_url(settings.resolved_database_url())
    except (ValidationError, ValueError) as error:
        print(f"psych-sidecar: invalid configuration: {error}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    # Alembic narrates every plugin it loads at INFO; migrations still log their upgrades.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    if arguments.command == "migrate":
        from psych_sidecar.storage.db import create_database_engine, current_revision, migrate

        engine = create_database_engine(settings.resolved_database_url(), pool_size=1)
        migrate(engine)
        print(f"database at revision {current_revision(engine)}")
        engine.dispose()
        return 0
    from psych_sidecar.api.server import serve

    asyncio.run(serve(settings))
    return 0

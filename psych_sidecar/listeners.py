"""Where the sidecar listens: one policy for every listener (the gRPC API, health only, the
admin HTTP listener).

A Unix socket's directory is created; a socket file left by a crashed sidecar is removed, one a
live process still answers on is refused; once bound, the socket gets `unix_socket_mode`, and
only the listener that bound it removes it. A TCP port another process listens on is refused
before anything starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import Iterable

from psych_sidecar.config import ListenAddress, Settings

log = logging.getLogger(__name__)


class StartupError(Exception):
    """An expected reason the sidecar cannot start (another sidecar on its socket, a port in
    use): the command prints it as one line and exits 1, without a traceback."""


def prepare_unix_socket(path: str) -> None:
    """Create the socket's directory and clear a stale socket left by a crashed sidecar,
    refusing to take over one that a live process still answers on."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise StartupError(f"cannot listen on unix:{path}: the file exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        # Nobody accepts there: the file of a sidecar that did not stop cleanly.
        os.unlink(path)
        log.info("removed the stale socket file %s", path)
    except OSError as error:
        raise StartupError(f"cannot listen on unix:{path}: {error.strerror}") from error
    else:
        raise StartupError(
            f"another sidecar is already serving on unix:{path}; "
            "stop it first, or give this one another listen address"
        )
    finally:
        probe.close()


def restrict_unix_sockets(addresses: Iterable[ListenAddress], mode: int) -> None:
    """Give the bound Unix sockets among `addresses` their permissions."""
    for address in addresses:
        if address.unix_path is not None:
            os.chmod(address.unix_path, mode)


def remove_unix_sockets(paths: Iterable[str]) -> None:
    """On stop, the listener that bound these socket files removes them (one already gone is
    fine)."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def check_tcp_port(address: ListenAddress) -> None:
    """Refuse a TCP address another process listens on, before anything else starts (gRPC
    would otherwise log its own error, or share the port with SO_REUSEPORT)."""
    if address.port == 0:
        return
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(address.host, address.port, family, socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise StartupError(f"cannot listen on {address.grpc_target}: {error.strerror}") from error
    for *_, sockaddr in infos:
        probe = socket.socket(family, socket.SOCK_STREAM)
        # As gRPC binds: a port whose old connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as error:
            raise StartupError(
                f"cannot listen on {address.grpc_target}: {error.strerror}"
            ) from error
        finally:
            probe.close()


def check_listeners(settings: Settings) -> None:
    """Fail early, with a StartupError, when a listen address is taken: before migrations run
    and before any session starts. A stale socket file is removed."""
    for address in [
        *settings.listen_addresses(),
        *settings.health_listen_addresses(),
        *settings.admin_listen_addresses(),
    ]:
        if address.unix_path is not None:
            prepare_unix_socket(address.unix_path)
        else:
            check_tcp_port(address)

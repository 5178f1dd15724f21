"""AdminServer: a Starlette app on uvicorn, on sockets the sidecar binds itself."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator, Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from psych_sidecar.config import ListenAddress
from psych_sidecar.listeners import (
    prepare_unix_socket,
    remove_unix_sockets,
    restrict_unix_sockets,
)

log = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside someone else's event loop: the sidecar owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(address: ListenAddress) -> socket.socket:
    if address.unix_path is not None:
        prepare_unix_socket(address.unix_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(address.unix_path)
    else:
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.host, address.port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _describe(sock: socket.socket, address: ListenAddress) -> str:
    if address.unix_path is not None:
        return f"unix:{address.unix_path}"
    host, port = sock.getsockname()[:2]
    return "http://" + ListenAddress(host=host, port=port).grpc_target


class AdminServer:
    """Serves `routes` on `addresses` until stopped, its Unix sockets with permissions
    `unix_socket_mode`, as the API's. `bound` lists the URLs actually bound (a TCP port 0
    resolved)."""

    def __init__(
        self,
        addresses: Sequence[ListenAddress],
        routes: Sequence[BaseRoute],
        unix_socket_mode: int,
    ) -> None:
        self._addresses = list(addresses)
        self._unix_socket_mode = unix_socket_mode
        self.app = Starlette(routes=list(routes))
        self._server = _EmbeddedServer(
            uvicorn.Config(
                self.app,
                lifespan="off",
                # The sidecar configures logging; uvicorn must not replace it.
                log_config=None,
                # uvicorn's own lines ("Started server process") would only mislead here.
                log_level=logging.WARNING,
                access_log=False,
                server_header=False,
                timeout_graceful_shutdown=2,
            )
        )
        self._sockets: list[socket.socket] = []
        self._task: asyncio.Task[None] | None = None
        self.bound: list[str] = []

    async def start(self) -> None:
        for address in self._addresses:
            sock = _bind(address)
            self._sockets.append(sock)
            self.bound.append(_describe(sock, address))
        restrict_unix_sockets(self._addresses, self._unix_socket_mode)
        self._task = asyncio.create_task(self._server.serve(sockets=self._sockets))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the admin listener stopped while starting")
            await asyncio.sleep(0.01)
        log.info("admin listener on %s", ", ".join(self.bound))

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        for sock in self._sockets:
            sock.close()
        remove_unix_sockets(a.unix_path for a in self._addresses if a.unix_path is not None)

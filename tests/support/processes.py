"""Processes the tests start and stop: `psych-sidecar serve` and MCP servers on loopback
ports."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.databases import TEST_SECRET_KEY
from tests.support.polling import wait_for


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    def accepting() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode} before listening")
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    wait_for(accepting, f"a server listening on port {port}")


class HttpServer:
    """A server process listening on a loopback port, which a test can kill and restart."""

    def __init__(self, argv: Sequence[str], port: int, env: Mapping[str, str] | None = None):
        self.argv = list(argv)
        self.port = port
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HttpServer:
        self.process = subprocess.Popen(self.argv, env=self.env, start_new_session=True)
        wait_for_port(self.port, self.process)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


@contextlib.contextmanager
def running(server: HttpServer) -> Iterator[HttpServer]:
    """The server, started; killed on the way out."""
    server.start()
    try:
        yield server
    finally:
        server.kill()


# `psych-sidecar serve` as an operator runs it ----------------------------------------------

COMMAND = [sys.executable, "-m", "psych_sidecar"]


def health_status(target: str) -> int | None:
    """What grpc.health.v1 Check("") answers at `target` (a gRPC target), None if nothing
    answers. A new channel each time: a channel that failed to connect backs off for a second
    or more before it tries again."""
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        except grpc.RpcError:
            return None
        status: int = response.status
        return status


class ServedSidecar:
    """A `psych-sidecar serve` process with these flags, started at once, in this process's
    environment without its PSYCH_SIDECAR_* variables but with `env` (a None value unsets a
    variable). Its log (stderr, and stdout with it) goes to a file: `log` reads it, also after
    it stopped.

    `health` is the gRPC target its health service answers on; by default the first
    `--listen` address (a listen address is also a gRPC target). Only `wait_serving` needs
    it: a start that must fail has none."""

    def __init__(
        self,
        *flags: str,
        health: str | None = None,
        env: Mapping[str, str | None] | None = None,
        cwd: Path | None = None,
    ) -> None:
        if health is None and "--listen" in flags:
            health = flags[flags.index("--listen") + 1]
        self.health = health
        self.flags = flags
        environment = {k: v for k, v in os.environ.items() if not k.startswith("PSYCH_SIDECAR_")}
        # The tests' key (PostgreSQL needs one); a test of the key file made beside a SQLite
        # database unsets it.
        environment["PSYCH_SIDECAR_SECRET_KEYS"] = TEST_SECRET_KEY
        for name, value in (env or {}).items():
            if value is None:
                environment.pop(name, None)
            else:
                environment[name] = value
        descriptor, log_path = tempfile.mkstemp(prefix="psych-sidecar-", suffix=".log")
        os.close(descriptor)
        self._log_path = Path(log_path)
        self._log: str | None = None
        # Append mode: the process writes at the end, wherever a reader of the file is.
        with self._log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*COMMAND, "serve", *flags],
                cwd=cwd,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    @property
    def log(self) -> str:
        if self._log is not None:
            return self._log
        return self._log_path.read_text(errors="replace")

    def wait_serving(self, within: float = 60) -> None:
        """Until its health service answers SERVING; fails, with its log, if it exits first
        or does not get there within `within` seconds."""
        health = self.health
        assert health is not None, "say where its health service answers: health="
        # grpc_health has no type information: the enum value, as the int it is.
        serving_status: int = health_pb2.HealthCheckResponse.SERVING

        def serving() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(self.said(f"exited with {self.process.returncode}"))
            return health_status(health) == serving_status

        wait_for(serving, lambda: self.said(f"{health} to report SERVING"), within=within)

    def exit_status(self, within: float = 60) -> int:
        """Wait for it to exit and give its exit status; killed if it takes longer than
        `within` seconds, so nothing is left running."""
        try:
            return self.process.wait(within)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            self._ended()

    def stop(self, within: float = 60) -> int:
        """SIGTERM (unless it already exited), then `exit_status`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.exit_status(within)

    def stop_cleanly(self) -> None:
        """`stop`: it must exit 0."""
        status = self.stop()
        assert status == 0, self.said(f"exited with {status} when stopped")

    def kill(self) -> None:
        """SIGKILL: a crash, leaving its socket file and whatever it was writing."""
        self.process.kill()
        self.exit_status(30)

    def said(self, what: str) -> str:
        """`what` happened, for a failure message: with the command line and the log."""
        return f"psych-sidecar serve {' '.join(self.flags)}: {what}; its log:\n{self.log}"

    def _ended(self) -> None:
        if self._log is None and self.process.poll() is not None:
            self._log = self._log_path.read_text(errors="replace")
            self._log_path.unlink()


@contextlib.contextmanager
def served(
    *flags: str,
    health: str | None = None,
    env: Mapping[str, str | None] | None = None,
    cwd: Path | None = None,
    within: float = 60,
) -> Iterator[ServedSidecar]:
    """A `ServedSidecar`, SERVING. On the way out it is stopped with SIGTERM and must exit 0;
    if the block failed, its log is printed (pytest shows it with the failure)."""
    sidecar = ServedSidecar(*flags, health=health, env=env, cwd=cwd)
    serving = False
    try:
        sidecar.wait_serving(within)
        serving = True
        yield sidecar
    except BaseException:
        sidecar.stop()
        if serving:  # a failed start said its log already
            print(sidecar.said("the test failed"))
        raise
    sidecar.stop_cleanly()

"""Start, wait for and stop the server processes that cases measure.

Reusable by every case: :func:`sidecar` runs the real ``psych-sidecar serve``
on a free loopback port with its own SQLite file (or a given database URL),
:func:`echo_server` runs the bare ``grpc.aio`` baseline from
:mod:`bench._echo_server`. Both are separate processes, are waited for with a
bounded timeout, and are stopped (SIGTERM, then SIGKILL) on exit.
"""

from __future__ import annotations

import asyncio
import base64
import compileall
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Same options for every client channel a case opens, so comparisons are fair.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]

# For the readiness probe: gRPC waits 1 s after a refused connection before trying again, then
# 1.6 s, 2.6 s…, failing calls meanwhile; a probe started before the server listens would
# otherwise time the client's backoff (a start of ~1.2 s was measured as 2.6-2.9 s).
PROBE_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 100),
]

REPO_ROOT = Path(__file__).resolve().parent.parent
# One key for the sidecars of this run (see `sidecar`).
_BENCH_SECRET_KEY = base64.b64encode(os.urandom(32)).decode()


class ProcessDiedError(RuntimeError):
    """A server process exited (or never became ready) while we waited."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS says is free now (racy in principle; fine for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def sidecar_command() -> list[str]:
    """How to start the sidecar: the console script beside this Python, on
    PATH, or ``python -m psych_sidecar``."""
    beside = Path(sys.executable).parent / "psych-sidecar"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("psych-sidecar")
    if found:
        return [found]
    return [sys.executable, "-m", "psych_sidecar"]


def compile_sidecar_modules() -> None:
    """Write the bytecode of the sidecar's modules and of its generated contract modules, as
    the image does when it is built (deploy/Dockerfile). An editable install has none, and
    with PYTHONDONTWRITEBYTECODE set every start would compile them all again."""
    for package in ("psych_sidecar", "psych"):
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(location, quiet=1)


def sidecar_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a sidecar of this run gets besides ours: `env`, and the one key every
    sidecar of a run seals stored secrets with (PostgreSQL needs one; sidecars sharing a
    database need the same), unless the environment gives its own."""
    keys = os.environ.get("PSYCH_SIDECAR_SECRET_KEYS", _BENCH_SECRET_KEY)
    return {"PSYCH_SIDECAR_SECRET_KEYS": keys, **(env or {})}


def cpu_split() -> tuple[set[int], set[int]] | None:
    """Split the CPUs this process may use into (client, servers), or None
    when there are fewer than two or affinity is not supported.

    Pinning the load generator and the server under test to different cores
    removes most of the scheduler noise of a small shared machine; only one
    server is driven at a time, so servers may share their half. Set
    PSYCH_BENCH_PIN=0 to turn pinning off.
    """
    if os.environ.get("PSYCH_BENCH_PIN", "1") == "0" or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def pin(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of ``pid`` (threads it creates
    later inherit it). Best effort: threads that vanish meanwhile are skipped."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cpus)


@contextlib.contextmanager
def pinned_self(cpus: set[int]) -> Iterator[None]:
    """Pin this process (all its threads) to ``cpus`` for the block."""
    before = os.sched_getaffinity(0)
    pin(os.getpid(), cpus)
    try:
        yield
    finally:
        pin(os.getpid(), before)


def channel(target: str) -> grpc.aio.Channel:
    """An insecure ``grpc.aio`` client channel with the shared options."""
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


class ManagedProcess:
    """A child process whose stdout+stderr go to a log file."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log: IO[bytes] | None = None
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self._env,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        assert self.popen is not None
        rc = self.popen.poll()
        if rc is not None:
            raise ProcessDiedError(
                f"{self.name} exited with code {rc}: {' '.join(self.argv)}\n"
                f"--- last lines of {self.log_path} ---\n{self.log_tail()}"
            )

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL. Returns the exit code."""
        if self.popen is None:
            return None
        terminated = False
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
                terminated = True
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"  {self.name} ignored SIGTERM for {timeout:g} s; killing", file=sys.stderr)
                with contextlib.suppress(ProcessLookupError):
                    self.popen.kill()
                self.popen.wait()
        if self._log is not None:
            self._log.close()
        rc = self.popen.returncode
        # Ended by the SIGTERM sent here: stopped as asked (uvicorn, for one, shuts down
        # gracefully and then re-raises the signal, so its status says so).
        if rc != 0 and not (terminated and rc == -signal.SIGTERM):
            print(
                f"  warning: {self.name} exited with code {rc} when stopped\n"
                f"--- last lines of {self.log_path} ---\n{self.log_tail(15)}",
                file=sys.stderr,
            )
        return rc

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def managed(
    name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
) -> Iterator[ManagedProcess]:
    with ManagedProcess(name, argv, log_path, env) as proc:
        yield proc


async def wait_until(
    proc: ManagedProcess, probe: Callable[[], Awaitable[bool]], *, within: float, what: str
) -> float:
    """Poll ``probe`` until it returns True; fail if ``proc`` dies or time runs
    out. Returns the seconds waited."""
    start = time.monotonic()
    last_error: BaseException | None = None
    while True:
        proc.check_alive()
        try:
            if await probe():
                return time.monotonic() - start
        except (grpc.RpcError, OSError) as exc:
            last_error = exc
        if time.monotonic() - start > within:
            raise ProcessDiedError(
                f"{proc.name} not {what} after {within:g} s (last error: {last_error!r})\n"
                f"--- last lines of {proc.log_path} ---\n{proc.log_tail()}"
            )
        await asyncio.sleep(0.1)


async def wait_for_health(
    proc: ManagedProcess, target: str, *, service: str = "", within: float = 60.0
) -> float:
    """Wait until grpc.health.v1 Check(service) answers SERVING (polled every 0.1 s, the
    channel reconnecting as often)."""
    async with grpc.aio.insecure_channel(target, options=PROBE_CHANNEL_OPTIONS) as ch:
        stub = health_pb2_grpc.HealthStub(ch)

        async def probe() -> bool:
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2.0)
            return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

        return await wait_until(proc, probe, within=within, what="SERVING")


@dataclass(frozen=True)
class Server:
    """A running server: where to reach it and its process."""

    target: str
    process: ManagedProcess
    ready_seconds: float


@contextlib.asynccontextmanager
async def sidecar(
    tmp_dir: Path,
    *,
    database_url: str | None = None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    name: str = "sidecar",
    ready_timeout: float = 60.0,
) -> AsyncIterator[Server]:
    """Run ``psych-sidecar serve`` until the block ends.

    Listens on a free 127.0.0.1 port; the database defaults to a fresh SQLite
    file in ``tmp_dir``. Yields once health Check("") is SERVING.
    """
    port = free_port()
    if database_url is None:
        database_url = f"sqlite:///{tmp_dir / f'{name}.sqlite3'}"
    argv = [
        *sidecar_command(),
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--database-url",
        database_url,
        *extra_args,
    ]
    with managed(name, argv, tmp_dir / f"{name}.log", sidecar_env(env)) as proc:
        target = f"127.0.0.1:{port}"
        waited = await wait_for_health(proc, target, within=ready_timeout)
        yield Server(target, proc, waited)
        proc.check_alive()


@contextlib.asynccontextmanager
async def echo_server(
    tmp_dir: Path, *, name: str = "echo", ready_timeout: float = 60.0
) -> AsyncIterator[Server]:
    """Run the bare grpc.aio echo baseline (bench._echo_server) until the block ends."""
    from bench._echo_server import ECHO_METHOD

    port = free_port()
    argv = [sys.executable, "-m", "bench._echo_server", "--listen", f"127.0.0.1:{port}"]
    with managed(name, argv, tmp_dir / f"{name}.log") as proc:
        target = f"127.0.0.1:{port}"
        async with channel(target) as ch:
            echo: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = ch.unary_unary(ECHO_METHOD)

            async def probe() -> bool:
                return bool(await echo(b"ping", timeout=2.0) == b"ping")

            waited = await wait_until(proc, probe, within=ready_timeout, what="answering")
        yield Server(target, proc, waited)
        proc.check_alive()

"""The real grpc.aio sidecar in this process, its stubs, and the errors it answers with."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import pytest
import sqlalchemy as sa
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from psych.sidecar.v1 import (
    connection_service_pb2_grpc,
    run_service_pb2_grpc,
    spec_service_pb2_grpc,
    tool_service_pb2_grpc,
    turn_service_pb2_grpc,
)
from psych_sidecar.app.sidecar import Sidecar
from psych_sidecar.config import Settings

T = TypeVar("T")

# No client-side size limit, so the server's limits are what is tested.
UNLIMITED_CHANNEL = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]


class RunningSidecar:
    """A Sidecar serving on its own event loop in a background thread."""

    def __init__(self, settings: Settings, **options: Any) -> None:
        self.settings = settings
        self.sidecar = Sidecar(settings, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the sidecar serves on, for running coroutines against its objects."""
        return self._loop

    def __enter__(self) -> RunningSidecar:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.sidecar.start(), self._loop).result(60)
        return self

    @contextlib.contextmanager
    def stubs(self) -> Iterator[Stubs]:
        """Stubs on a channel to its first listen address (no client-side size limit), closed
        after the block."""
        with grpc.insecure_channel(self.sidecar.bound[0], options=UNLIMITED_CHANNEL) as channel:
            yield Stubs.on(channel)

    @contextlib.contextmanager
    def stored(self) -> Iterator[sa.Connection]:
        """A transaction on the sidecar's own database, for a test that reads or changes what
        it stored directly (e.g. a deadline moved into the past instead of waited for)."""
        engine = sa.create_engine(self.settings.resolved_database_url())
        try:
            with engine.begin() as connection:
                yield connection
        finally:
            engine.dispose()

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.sidecar.stop(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def on_loop(sidecar: RunningSidecar, coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the sidecar's own event loop (the MCP sessions live there)."""
    return asyncio.run_coroutine_threadsafe(coroutine, sidecar.loop).result(120)


@dataclass
class Stubs:
    specs: spec_service_pb2_grpc.SpecServiceStub
    runs: run_service_pb2_grpc.RunServiceStub
    turns: turn_service_pb2_grpc.TurnServiceStub
    tools: tool_service_pb2_grpc.ToolServiceStub
    connections: connection_service_pb2_grpc.ConnectionServiceStub

    @classmethod
    def on(cls, channel: grpc.Channel) -> Stubs:
        """One generated stub per service, on `channel`."""
        return cls(
            specs=spec_service_pb2_grpc.SpecServiceStub(channel),
            runs=run_service_pb2_grpc.RunServiceStub(channel),
            turns=turn_service_pb2_grpc.TurnServiceStub(channel),
            tools=tool_service_pb2_grpc.ToolServiceStub(channel),
            connections=connection_service_pb2_grpc.ConnectionServiceStub(channel),
        )


@dataclass
class RpcFailure:
    code: grpc.StatusCode
    message: str
    info: error_details_pb2.ErrorInfo
    detail_count: int


def rpc_failure(call: Callable[[], object]) -> RpcFailure:
    """Run a call that must fail and return its status and its single ErrorInfo."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error: Any = caught.value
    status = rpc_status.from_call(error)
    assert status is not None, f"no google.rpc.Status on {error.code()}: {error.details()}"
    infos = []
    for detail in status.details:
        # Besides its ErrorInfo, a retryable error may carry a google.rpc.RetryInfo.
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            continue
        info = error_details_pb2.ErrorInfo()
        assert detail.Unpack(info)
        infos.append(info)
    assert len(infos) == 1
    assert infos[0].domain == "psych.sidecar.v1"
    return RpcFailure(error.code(), status.message, infos[0], len(status.details))

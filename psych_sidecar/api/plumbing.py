"""What every servicer shares: the context alias, the thread hop off the event loop
(`Blocking`) and responses already serialized on a worker thread (`Serialized`)."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from psych_sidecar.telemetry import metrics

T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True, slots=True)
class Serialized:
    """A response a servicer has already serialized, on a worker thread: encoding a response
    of tens of MB takes tens of milliseconds, which the event loop must not spend (the
    server's serializer passes these bytes through, `serialize_response`)."""

    data: bytes


def serialize_response(response: Message | Serialized) -> bytes:
    """A response's wire bytes: a message is serialized here (on the event loop), a
    Serialized one is already."""
    if isinstance(response, Serialized):
        return response.data
    return response.SerializeToString()


class Blocking:
    """Runs synchronous domain calls on the storage thread pool, in the caller's context
    (its span and log fields), recording how long each waited for a thread.

    The hop is `loop.run_in_executor`'s minus its second future: the worker settles the
    awaited asyncio future itself (one `call_soon_threadsafe`), rather than a
    concurrent.futures future chained to an asyncio one by callbacks both ways. A call
    cancelled before a worker took it does not run, as with run_in_executor. Kept because it
    is measurably cheaper: `loop.run_in_executor` with the same context copy and metric took
    1.19x and 1.35x as long per hop in two runs of six alternating rounds of 20,000 hops on
    this 2-core machine (every round slower, by 1.13x to 1.63x)."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    async def __call__(self, function: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        context = contextvars.copy_context()
        submitted = time.perf_counter()

        def run() -> None:
            metrics.record_storage_wait(time.perf_counter() - submitted)
            try:
                result = context.run(function, *args)
            except BaseException as error:
                _settle_soon(loop, future, None, error)
            else:
                _settle_soon(loop, future, result, None)

        work = self._executor.submit(run)
        try:
            return await future
        except asyncio.CancelledError:
            work.cancel()
            raise


def _settle_soon(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[T],
    result: T | None,
    error: BaseException | None,
) -> None:
    """From a worker thread: settle `future` on its loop (unless the loop is gone: nobody
    awaits it any more)."""
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:
        if not loop.is_closed():
            raise


def _settle(future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if future.done():  # cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]

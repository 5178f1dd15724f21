"""kill -9 during appends, on SQLite and PostgreSQL: the real `psych-sidecar serve` process is
killed while a client appends without pause, restarted on the same database, and the client
retries the append it was waiting for with the same request id. After 10 cycles every
acknowledged record is stored exactly once and the Run's sequences are gap-free.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from psych.sidecar.v1 import run_service_pb2
from tests.support.polling import wait_for
from tests.support.processes import ServedSidecar, free_port
from tests.support.requests import all_records, new_run, user
from tests.support.sidecar import Stubs

CYCLES = 10
# Appends acknowledged between two kills: enough for the kill to land mid-append.
APPENDS_PER_CYCLE = 15


class Sidecar:
    """`psych-sidecar serve` on a free loopback port, killed with SIGKILL on demand."""

    def __init__(self, database_url: str, data_dir: Path) -> None:
        self.database_url = database_url
        self.data_dir = data_dir
        self.served: ServedSidecar | None = None
        self.address = ""

    def start(self) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.served = ServedSidecar(
            "--listen",
            self.address,
            "--database-url",
            self.database_url,
            "--data-dir",
            str(self.data_dir),
            env={"PSYCH_SIDECAR_SEMANTIC_SEARCH": "off"},
        )
        self.served.wait_serving()

    def kill(self) -> None:
        assert self.served is not None
        self.served.kill()

    def stop(self) -> None:
        if self.served is not None:
            self.served.stop()


@pytest.fixture
def sidecar(database_url: str, tmp_path: Path) -> Iterator[Sidecar]:
    """A sidecar process on the module's database (SQLite or PostgreSQL)."""
    running = Sidecar(database_url, tmp_path)
    running.start()
    yield running
    running.stop()


def _stubs(address: str) -> tuple[grpc.Channel, Stubs]:
    channel = grpc.insecure_channel(address)
    return channel, Stubs.on(channel)


def test_kill_9_during_appends_loses_and_duplicates_nothing_acknowledged(
    sidecar: Sidecar,
) -> None:
    channel, stubs = _stubs(sidecar.address)
    run_id = new_run(stubs, f"crash-{os.getpid()}-{time.monotonic_ns()}")
    channel.close()
    acknowledged: dict[str, list[int]] = {}
    number = 0
    for _cycle in range(CYCLES):
        channel, stubs = _stubs(sidecar.address)
        stop = threading.Event()
        pending: list[str] = []

        def append_until_killed(
            stubs: Stubs = stubs, stop: threading.Event = stop, pending: list[str] = pending
        ) -> None:
            nonlocal number
            while not stop.is_set():
                number += 1
                request_id = f"r{number}"
                pending.append(request_id)
                try:
                    answer = stubs.runs.AppendRecords(
                        run_service_pb2.AppendRecordsRequest(
                            run_id=run_id, request_id=request_id, records=[user(request_id)]
                        ),
                        timeout=10,
                    )
                except grpc.RpcError:
                    return  # killed mid-append: the answer is lost, the retry finds out
                pending.remove(request_id)
                acknowledged[request_id] = [r.sequence for r in answer.records]

        appender = threading.Thread(target=append_until_killed)
        target = len(acknowledged) + APPENDS_PER_CYCLE
        appender.start()

        def acknowledged_or_ended(
            target: int = target, appender: threading.Thread = appender
        ) -> bool:
            return len(acknowledged) >= target or not appender.is_alive()

        wait_for(
            acknowledged_or_ended,
            f"{APPENDS_PER_CYCLE} appends acknowledged",
            within=60,
            every=0.002,
        )
        sidecar.kill()
        stop.set()
        appender.join(30)
        channel.close()
        sidecar.start()
        channel, stubs = _stubs(sidecar.address)
        # The append whose answer was lost: retried with its request id, stored once.
        for request_id in pending:
            answer = stubs.runs.AppendRecords(
                run_service_pb2.AppendRecordsRequest(
                    run_id=run_id, request_id=request_id, records=[user(request_id)]
                ),
                timeout=30,
            )
            acknowledged[request_id] = [r.sequence for r in answer.records]
        channel.close()

    channel, stubs = _stubs(sidecar.address)
    stored = all_records(stubs, run_id)
    channel.close()
    sequences = [record.sequence for record in stored]
    assert sequences == list(range(1, len(stored) + 1)), "gaps or disorder in the sequences"
    texts = [record.user_message.content[0].text for record in stored]
    assert len(set(texts)) == len(texts), "a record was stored twice"
    by_text = dict(zip(texts, sequences, strict=True))
    for request_id, acked in acknowledged.items():
        assert by_text.get(request_id) == acked[0], f"{request_id} lost or moved"
    assert len(acknowledged) >= CYCLES * APPENDS_PER_CYCLE

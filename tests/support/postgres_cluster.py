"""A throwaway PostgreSQL cluster of a test's own, started by scripts/with-postgres (the one
place that knows how to start one: binaries, a non-root owner, a free port, a temp directory),
for a test that stops and restarts its server. The cluster lives as long as the context."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

WITH_POSTGRES = Path(__file__).resolve().parents[2] / "scripts" / "with-postgres"
# What scripts/with-postgres exports, reported by the command it runs, which then waits for
# its stdin to close (the test's end) before the script stops the cluster and cleans up.
_REPORT = (
    "import json, os, sys\n"
    "print(json.dumps({k: v for k, v in os.environ.items()"
    " if k.startswith('PSYCH_TEST_POSTGRES_')}), flush=True)\n"
    "sys.stdin.read()\n"
)
# A guard against a hang, not a speed check.
_START_SECONDS = 120


@dataclass(frozen=True)
class Cluster:
    url: str
    data: str
    bin_dir: str

    def _as_owner(self) -> list[str]:
        """PostgreSQL refuses to run as root: as root, pg_ctl runs as the data's owner."""
        owner = os.stat(self.data).st_uid
        if os.geteuid() == 0 and owner != 0:
            return ["runuser", "-u", pwd.getpwuid(owner).pw_name, "--"]
        return []

    def pg_ctl(self, *args: str) -> None:
        subprocess.run(
            [*self._as_owner(), os.path.join(self.bin_dir, "pg_ctl"), "-D", self.data, *args],
            check=True,
            capture_output=True,
            timeout=_START_SECONDS,
        )

    def crash(self) -> None:
        """Stop the server the way a crash does: no shutdown checkpoint, recovery at start."""
        self.pg_ctl("-m", "immediate", "-w", "-t", "60", "stop")

    def start(self) -> None:
        log = os.path.join(os.path.dirname(self.data), "postgres.log")
        self.pg_ctl("-l", log, "-w", "-t", "60", "start")


@contextlib.contextmanager
def own_cluster(*, durable: bool) -> Iterator[Cluster]:
    """A cluster of this test's own; `durable`: fsync, synchronous_commit and
    full_page_writes on (PSYCH_PG_DURABLE=1)."""
    env = {**os.environ, "PSYCH_PG_DURABLE": "1" if durable else "0"}
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen(
            [str(WITH_POSTGRES), sys.executable, "-c", _REPORT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            env=env,
            text=True,
        )
        # Both are pipes, as asked for above.
        assert process.stdin is not None
        assert process.stdout is not None
        try:
            line = process.stdout.readline()
            if not line:
                process.wait(_START_SECONDS)
                errors.seek(0)
                if process.returncode == 127:
                    pytest.skip(f"no PostgreSQL to start: {errors.read().strip()}")
                pytest.fail(f"scripts/with-postgres failed: {errors.read()}")
            exported = json.loads(line)
            yield Cluster(
                url=exported["PSYCH_TEST_POSTGRES_URL"],
                data=exported["PSYCH_TEST_POSTGRES_DATA"],
                bin_dir=exported["PSYCH_TEST_POSTGRES_BIN"],
            )
        finally:
            process.stdin.close()
            process.wait(_START_SECONDS)
            process.stdout.close()

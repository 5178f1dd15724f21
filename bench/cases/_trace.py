"""The reference trace of the billed-input cases: a seeded conversation over real MCP servers.

`build_trace(seed)` makes it; `bench/data/prompt_budget_trace.json` is its output, kept in the
repository (the cases read the file; `python -m bench.cases._trace` rewrites it and a case
checks the two agree). `materialize(trace, root)` writes the files the filesystem server reads
and the git repository the git server reads, byte for byte the same on every machine.

A trace is turns of a user message and model steps. A step is the model's text and its tool
calls, each `{"server", "tool", "arguments"}` (paths relative to the workspace, as
`{root}/...`); a call with `"sidecar": "describe"` is a discovery call a model makes only
through the sidecar's meta tools (the other hosts have every schema already). The last step
of a turn has no calls: the model's answer.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

TRACE_PATH = Path(__file__).parent.parent / "data" / "prompt_budget_trace.json"
SEED = 13
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "request",
    "handled",
    "status",
    "worker",
    "queue",
    "retry",
    "timeout",
    "cache",
    "shard",
    "region",
    "latency",
    "bytes",
    "index",
    "commit",
    "branch",
    "merge",
    "deploy",
    "config",
    "token",
    "budget",
    "prompt",
    "elide",
]


def _text(size: int, seed: int) -> bytes:
    """`size` bytes of log-like ASCII text, seeded."""
    rnd = random.Random(seed)
    lines = []
    total = 0
    number = 0
    while total < size:
        words = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(4, 14)))
        line = f"{number:07d} {words} value={rnd.randint(0, 99999)}\n"
        lines.append(line)
        total += len(line)
        number += 1
    return "".join(lines).encode()[:size]


def _png(width: int, height: int, seed: int) -> bytes:
    """A valid RGB PNG of seeded noise (barely compressible, like a photo)."""
    rnd = random.Random(seed)
    raw = b"".join(b"\x00" + rnd.randbytes(width * 3) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def build_trace(seed: int = SEED, turns: int = 16) -> dict[str, Any]:
    """The trace of `turns` turns; the reference has 16, a longer one begins with the same
    16 (the draws continue where the reference's stop)."""
    rnd = random.Random(seed)
    # Files from 100 B to 5 MB, log-uniform, plus two of exactly 5 MB.
    files: list[dict[str, Any]] = [
        {"path": f"logs/part-{i:02d}.log", "bytes": int(100 * 50_000 ** rnd.random()), "seed": i}
        for i in range(14)
    ]
    files += [
        {"path": "logs/full-a.log", "bytes": 5_000_000, "seed": 100},
        {"path": "logs/full-b.log", "bytes": 5_000_000, "seed": 101},
        {"path": "notes/readme.txt", "bytes": 100, "seed": 102},
    ]
    images = [{"path": "img/photo.png", "width": 160, "height": 120, "seed": 200}]

    def fs(tool: str, **arguments: Any) -> dict[str, Any]:
        return {"server": "filesystem", "tool": tool, "arguments": arguments}

    def read(path: str) -> dict[str, Any]:
        return fs("read_text_file", path="{root}/" + path)

    pool: list[dict[str, Any]] = [read(f["path"]) for f in files[:14]]
    pool += [
        fs("read_media_file", path="{root}/img/photo.png"),
        fs("read_text_file", path="{root}/logs/missing.log"),  # a failure
        fs("list_directory", path="{root}/logs"),
        fs("directory_tree", path="{root}"),
        fs("search_files", path="{root}", pattern="part-0"),
        fs("get_file_info", path="{root}/logs/full-a.log"),
        {"server": "everything", "tool": "echo", "arguments": {"message": "ping " * 20}},
        {"server": "everything", "tool": "get-sum", "arguments": {"a": 17, "b": 25}},
        {
            "server": "everything",
            "tool": "get-structured-content",
            "arguments": {"location": "Chicago"},
        },
        {"server": "everything", "tool": "get-tiny-image", "arguments": {}},
        {
            "server": "everything",
            "tool": "get-annotated-message",
            "arguments": {"messageType": "error", "includeImage": True},
        },
        {"server": "everything", "tool": "get-resource-links", "arguments": {"count": 3}},
        {"server": "memory", "tool": "read_graph", "arguments": {}},
        {"server": "memory", "tool": "search_nodes", "arguments": {"query": "service"}},
        {"server": "git", "tool": "git_status", "arguments": {"repo_path": "{repo}"}},
        {"server": "git", "tool": "git_log", "arguments": {"repo_path": "{repo}", "max_count": 20}},
        {
            "server": "git",
            "tool": "git_show",
            "arguments": {"repo_path": "{repo}", "revision": "HEAD"},
        },
        {
            "server": "git",
            "tool": "git_show",
            "arguments": {"repo_path": "{repo}", "revision": "no-such-rev"},
        },
        {
            "server": "time",
            "tool": "convert_time",
            "arguments": {
                "source_timezone": "Europe/Oslo",
                "time": "09:30",
                "target_timezone": "Asia/Tokyo",
            },
        },
        {
            "server": "time",
            "tool": "convert_time",
            "arguments": {
                "source_timezone": "Mars/Olympus",
                "time": "09:30",
                "target_timezone": "UTC",
            },
        },
    ]
    conversation: list[dict[str, Any]] = []
    for number in range(turns):
        steps: list[dict[str, Any]] = []
        for step in range(rnd.randint(2, 4)):
            calls = [rnd.choice(pool) for _ in range(rnd.randint(1, 2))]
            if number == 0 and step == 0:
                calls = [
                    {
                        "server": "memory",
                        "tool": "create_entities",
                        "arguments": {
                            "entities": [
                                {
                                    "name": f"service-{i}",
                                    "entityType": "service",
                                    "observations": [
                                        f"runs in region {i}",
                                        "owned by the platform team",
                                    ],
                                }
                                for i in range(6)
                            ]
                        },
                    },
                    read(files[-1]["path"]),
                ]
            if number in (4, 11) and step == 1:
                calls = [read("logs/full-a.log" if number == 4 else "logs/full-b.log"), *calls[:1]]
            if number in (2, 7, 13) and step == 0:
                calls = [
                    {"sidecar": "describe", "server": "twilio", "tool_index": rnd.randint(0, 1408)},
                    *calls,
                ]
            steps.append(
                {"text": f"Step {step + 1} of turn {number + 1}: looking into it.", "calls": calls}
            )
        steps.append({"text": f"Here is what I found for question {number + 1}.", "calls": []})
        run = rnd.randint(1000, 9999)
        question = (
            f"Question {number + 1}: what do the logs and the repository say about run {run}?"
        )
        conversation.append({"user": question, "steps": steps})
    return {"seed": seed, "files": files, "images": images, "turns": conversation}


def load_trace() -> dict[str, Any]:
    trace: dict[str, Any] = json.loads(TRACE_PATH.read_text())
    if trace != build_trace(trace["seed"]):
        raise AssertionError(f"{TRACE_PATH} differs from build_trace(): regenerate it")
    return trace


def materialize(trace: dict[str, Any], root: Path, cap_bytes: int | None = None) -> Path:
    """Write the trace's files under `root` and a git repository at `root/repo`; files are
    cut to `cap_bytes` when set (--quick)."""
    for spec in trace["files"]:
        path = root / spec["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        size = spec["bytes"] if cap_bytes is None else min(spec["bytes"], cap_bytes)
        path.write_bytes(_text(size, spec["seed"]))
    for spec in trace["images"]:
        path = root / spec["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_png(spec["width"], spec["height"], spec["seed"]))
    repo = root / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Bench",
        "GIT_AUTHOR_EMAIL": "bench@example.invalid",
        "GIT_COMMITTER_NAME": "Bench",
        "GIT_COMMITTER_EMAIL": "bench@example.invalid",
        "GIT_AUTHOR_DATE": "2026-12-01T12:00:00Z",
        "GIT_COMMITTER_DATE": "2026-12-01T12:00:00Z",
    }

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    for number in range(12):
        (repo / f"module_{number % 4}.py").write_bytes(_text(2_000 + 300 * number, 300 + number))
        git("add", "-A")
        git("commit", "-q", "-m", f"change {number}: tune the {WORDS[number]} path")
    return repo


if __name__ == "__main__":
    TRACE_PATH.parent.mkdir(parents=True, exist_ok=True)
    TRACE_PATH.write_text(json.dumps(build_trace(), indent=1) + "\n")
    print(f"wrote {TRACE_PATH}", file=sys.stderr)

"""The README's snippets are the project's: each one is checked against what it claims."""

from __future__ import annotations

import re
from pathlib import Path

from psych_sidecar.config import load_settings

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(language: str, heading: str) -> list[str]:
    """The fenced code blocks of one language in the section under `heading`."""
    blocks: list[str] = []
    inside = False
    fence: list[str] | None = None
    for line in README.splitlines(keepends=True):
        if fence is not None:
            if line.rstrip("\n") == "```":
                if inside and fence[0] == language:
                    blocks.append("".join(fence[1:]))
                fence = None
            else:
                fence.append(line)
        elif line.startswith("```"):
            fence = [line.strip().removeprefix("```")]
        elif line.startswith("#"):
            inside = line.rstrip("\n") == heading
    return blocks


def test_the_stdio_config_allows_a_node_and_a_python_server(tmp_path: Path) -> None:
    (config,) = _blocks("toml", "### Allowing a stdio MCP server")
    assert len(config.strip().splitlines()) == 3
    path = tmp_path / "my-sidecar.toml"
    path.write_text(config)
    settings = load_settings(str(path))
    assert settings.mcp_commands["everything"].argv[0] == "npx"
    assert settings.mcp_commands["time"].argv == [".venv/bin/mcp-server-time"]
    # The Node server at the version the tests connect to.
    pinned = re.search(
        r'"@modelcontextprotocol/server-everything": "([^"]+)"',
        (ROOT / "tests" / "mcp-peers" / "package.json").read_text(),
    )
    assert pinned is not None
    assert f"@modelcontextprotocol/server-everything@{pinned.group(1)}" in (
        settings.mcp_commands["everything"].argv
    )
    (command,) = _blocks("sh", "### Allowing a stdio MCP server")
    assert command.strip() == f"scripts/serve --config {path.name}"


def _region(path: str) -> str:
    text = (ROOT / path).read_text()
    return text.split("// README begin\n", 1)[1].split("// README end", 1)[0]


def test_the_go_and_typescript_snippets_are_the_files_ci_runs() -> None:
    """tests/go (TestReadmeSnippet) and tests/ts (readme.test.ts) build and run these files
    against a sidecar; the README must show them as they are."""
    section = "## Using it from a host"
    assert _blocks("go", section) == [_region("tests/go/readme/main.go")]
    assert _blocks("ts", section) == [_region("tests/ts/src/readme.ts")]

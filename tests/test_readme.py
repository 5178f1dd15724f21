"""The README's snippets are the project's: each one is checked against what it claims."""

from __future__ import annotations

import re
from pathlib import Path

from psych_sidecar.config import load_settings

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(language: str, after: str) -> list[str]:
    """The fenced code blocks of one language in the section under the heading `after`."""
    section = README.split(after, 1)[1].split("\n#", 1)[0]
    return re.findall(rf"^```{language}\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)


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

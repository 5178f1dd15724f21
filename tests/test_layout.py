"""The layout the docs promise is the layout on disk: every module docs/design.md names
exists, every domain subpackage has its docstring and curated `__all__`, and the top level
holds what the README's Layout section lists."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "psych_sidecar"


def test_every_module_design_md_names_exists() -> None:
    text = (ROOT / "docs" / "design.md").read_text()
    named = set(re.findall(r"`((?:domain|search|mcp|storage|api|bulk)/[a-z_/]+\.py)`", text))
    assert len(named) > 20
    missing = sorted(path for path in named if not (PACKAGE / path).is_file())
    assert missing == []


def test_domain_subpackages_have_a_docstring_and_a_curated_surface() -> None:
    subpackages = [p for p in (PACKAGE / "domain").iterdir() if (p / "__init__.py").is_file()]
    assert {p.name for p in subpackages} == {
        "runlog",
        "catalog",
        "surface",
        "prompt",
        "calls",
        "inspect",
    }
    for package in [*subpackages, PACKAGE / "search"]:
        tree = ast.parse((package / "__init__.py").read_text())
        assert ast.get_docstring(tree), package
        exported = [
            node
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        ]
        assert exported, f"{package.name} has no __all__"
    loose = sorted(p.name for p in (PACKAGE / "domain").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 5, loose


def test_top_level_is_what_the_readme_lists() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    listed = {
        name.rstrip("/")
        for cell in re.findall(r"^\| ([^|]+) \|", section, re.M)
        for name in re.findall(r"`([^`]+)`", cell)
    }
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    tracked = {path.split("/", 1)[0] for path in files} - {".gitignore", ".dockerignore"}
    assert tracked - listed == set()
    for gone in ("src", "protos-baseline", "third_party", "tools"):
        assert not (ROOT / gone).exists()

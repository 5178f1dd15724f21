"""The host clients are packaged at the sidecar's version, and installed the way a host would."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys
import tomllib
from pathlib import Path

from psych_sidecar import __version__

ROOT = Path(__file__).parent.parent


def _pyproject(path: str) -> dict[str, object]:
    with (ROOT / path).open("rb") as file:
        project: dict[str, object] = tomllib.load(file)["project"]
        return project


def test_every_client_has_the_sidecars_version() -> None:
    version = _pyproject("pyproject.toml")["version"]
    assert version == __version__
    python_client = _pyproject("clients/python/pyproject.toml")
    assert python_client["version"] == version
    assert f"psych-sidecar=={version}" in python_client["dependencies"]  # type: ignore[operator]
    for package in ["clients/ts/package.json", "generated/ts/package.json"]:
        assert json.loads((ROOT / package).read_text())["version"] == version, package
    go_mod = (ROOT / "clients" / "go" / "go.mod").read_text()
    assert f"github.com/psych-sidecar/psych-sidecar/generated/go v{version}\n" in go_mod


def test_the_ts_client_is_a_self_contained_npm_package() -> None:
    package = json.loads((ROOT / "clients" / "ts" / "package.json").read_text())
    assert not package.get("private")
    assert package["name"] == "@psych-sidecar/client"
    assert package["types"] == "./dist/index.d.ts"
    assert set(package["exports"]) == {".", "./proto/*"}
    assert "dist" in package["files"]
    # Nothing by path: the tarball installs anywhere.
    assert all(not spec.startswith("file:") for spec in package["dependencies"].values())


def test_examples_and_tests_install_the_ts_client_from_its_tarball() -> None:
    version = json.loads((ROOT / "clients" / "ts" / "package.json").read_text())["version"]
    tarball = f"file:../../clients/ts/psych-sidecar-client-{version}.tgz"
    for project in ["examples/ts", "tests/ts"]:
        package = json.loads((ROOT / project / "package.json").read_text())
        assert package["dependencies"]["@psych-sidecar/client"] == tarball, project
        lock = json.loads((ROOT / project / "package-lock.json").read_text())
        entry = lock["packages"]["node_modules/@psych-sidecar/client"]
        assert entry["resolved"] == tarball, project
        # A rebuilt tarball has another hash: with none recorded, npm ci takes it.
        assert "integrity" not in entry, project
        sources = "".join(p.read_text() for p in (ROOT / project / "src").glob("*.ts"))
        assert not re.search(r'from "@psych-sidecar/proto', sources), project


def _distribution_name(requirement: str) -> str:
    name = re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_package_the_sidecar_imports_is_declared() -> None:
    """A package used only because another one brings it along breaks when that one stops."""
    declared = {
        _distribution_name(requirement)
        for requirement in _pyproject("pyproject.toml")["dependencies"]  # type: ignore[attr-defined]
    }
    providers = importlib.metadata.packages_distributions()
    undeclared: dict[str, list[str]] = {}
    for path in (ROOT / "psych_sidecar").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in ("psych_sidecar", "psych"):
                    continue
                distributions = {_distribution_name(d) for d in providers.get(top, [top])}
                if not distributions & declared:
                    undeclared.setdefault(top, []).append(str(path.relative_to(ROOT)))
    assert not undeclared, f"imported but not in pyproject.toml's dependencies: {undeclared}"

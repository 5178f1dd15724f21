"""The layout the docs promise is the layout on disk: every path the README and docs/ name
under the package exists, design.md's Layers tree lists every subpackage and names every module
in its package's entry, its migration table gives each file's real revision ids and names the
head, every domain subpackage has its docstring and curated `__all__` that the rest of the
package imports through, the top level holds what the README's Layout section lists and its
Documentation section every page of docs/, no module is over 500 lines or keeps state in a
thread-local (but those on an allowlist that only shrinks), and no test patches a module
constant."""

from __future__ import annotations

import ast
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "psych_sidecar"


DESIGN = (ROOT / "docs" / "design.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A backticked path in the docs that starts with one of the package's own folders or modules
# (`domain/calls/router.py`, `app/`, `listeners.py`), with or without `psych_sidecar/` before
# it, names a place under psych_sidecar/.
PACKAGE_PARTS = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
PACKAGE_MODULES = {p.name for p in PACKAGE.glob("*.py")}


def _package_paths(text: str) -> set[str]:
    named = set()
    for path in re.findall(r"`([a-z_]+(?:/[a-z_0-9]+)*(?:\.py|/)?)`", text):
        token = path.removeprefix("psych_sidecar/")
        first = token.split("/", 1)[0]
        if first in PACKAGE_MODULES or ("/" in token and first in PACKAGE_PARTS):
            named.add(token)
    return named


def test_every_path_the_docs_name_under_the_package_exists() -> None:
    assert len(_package_paths(DESIGN)) > 40
    missing = sorted(
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in DOCS
        for path in _package_paths(doc.read_text())
        if not (PACKAGE / path).exists()
    )
    assert missing == []


def test_the_layers_tree_lists_every_subpackage_and_names_only_real_ones() -> None:
    tree = DESIGN.split("```text\n", 1)[1].split("```", 1)[0]
    inside = tree.split("psych_sidecar/\n", 1)[1]
    top = set(re.findall(r"^  ([a-z_]+/|[a-z_]+\.py)", inside, re.M))
    domain = set(re.findall(r"^    ([a-z_]+/|[a-z_]+\.py)", inside, re.M))
    assert {name + "/" for name in PACKAGE_PARTS} <= top
    assert sorted(name for name in top if not (PACKAGE / name).exists()) == []
    assert sorted(name for name in domain if not (PACKAGE / "domain" / name).exists()) == []
    concerns = {p.name for p in (PACKAGE / "domain").iterdir() if (p / "__init__.py").is_file()}
    assert {name + "/" for name in concerns} <= domain


def _tree_entries() -> dict[str, str]:
    """The Layers tree under psych_sidecar/, by entry: a top-level subpackage (`mcp/`), a
    top-level module (`config.py`), or one of domain's concerns (`domain/calls/`; the loose
    domain modules are in `domain/`); each entry's text runs to the next entry."""
    tree = DESIGN.split("```text\n", 1)[1].split("```", 1)[0].split("psych_sidecar/\n", 1)[1]
    entries: dict[str, str] = {}
    key = ""
    for line in tree.splitlines():
        if top := re.match(r"  ([a-z_]+/|[a-z_]+\.py) ", line):
            key = top.group(1)
        elif key.startswith("domain/") and (concern := re.match(r"    ([a-z_]+/) ", line)):
            key = "domain/" + concern.group(1)
        elif key.startswith("domain/") and re.match(r"    [a-z_]+\.py ", line):
            key = "domain/"
        entries[key] = entries.get(key, "") + line + "\n"
    return entries


def _module_names(text: str) -> set[str]:
    """The module file names a text names bare (`router.py`, not `calls/router.py`)."""
    return set(re.findall(r"(?<![\w/])([a-z_][a-z0-9_]*\.py)\b", text))


def test_the_layers_tree_names_every_module_in_its_package_s_entry_and_only_real_ones() -> None:
    entries = _tree_entries()

    def entry(relative: Path) -> str:
        parts = relative.parts
        if len(parts) == 1:
            return ""
        if parts[0] == "domain" and len(parts) > 2:
            return f"domain/{parts[1]}/"
        return parts[0] + "/"

    unnamed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or "versions" in relative.parts:
            continue
        # A top-level module may be named in any entry (cli.py is config.py's neighbour).
        where = "".join(entries.values()) if len(relative.parts) == 1 else entries[entry(relative)]
        if path.name not in _module_names(where):
            unnamed.append(relative.as_posix())
    assert unnamed == []
    not_there = []
    for key, text in entries.items():
        folder = PACKAGE / key if key.endswith("/") else PACKAGE
        for name in _module_names(text):
            found = (folder / name).is_file() or (PACKAGE / name).is_file()
            if not found and not any(folder.rglob(name)):
                not_there.append(f"{key}: {name}")
    assert sorted(not_there) == []


def test_the_migration_table_gives_each_file_its_real_revision_ids_and_names_the_head() -> None:
    versions = PACKAGE / "storage" / "migrations" / "versions"
    real: dict[str, tuple[str, str | None]] = {}
    for path in versions.glob("*.py"):
        assigned = {
            node.target.id: ast.literal_eval(node.value)
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value is not None
        }
        real[path.name] = (assigned["revision"], assigned["down_revision"])
    # | `0002_usage_and_char_counts.py` | `0002` (`0001`) | what it adds |, the head's marked
    row = r"^\| `(\d{4}_[a-z_]+\.py)`( \(the head\))? \| `([^`]+)` \((.+?)\) \|"
    rows = re.findall(row, DESIGN, re.M)
    documented = {
        name: (revision, None if revises == "none" else revises.strip("`"))
        for name, _, revision, revises in rows
    }
    assert documented == real
    revised = {down for _, down in real.values()}
    (head,) = [name for name, (revision, _) in real.items() if revision not in revised]
    assert [name for name, is_head, _, _ in rows if is_head] == [head]


def test_domain_subpackages_have_a_docstring_and_a_curated_surface() -> None:
    subpackages = [p for p in (PACKAGE / "domain").iterdir() if (p / "__init__.py").is_file()]
    assert {p.name for p in subpackages} == {
        "runlog",
        "catalog",
        "surface",
        "prompt",
        "calls",
        "run_inspector",
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


def test_outside_a_domain_subpackage_nothing_imports_its_modules() -> None:
    # design.md: a subpackage's __init__ is its public face (surface's `naming` is exported as
    # a module, so `from psych_sidecar.domain.surface import naming` goes through the face too).
    concerns = {p.name for p in (PACKAGE / "domain").iterdir() if (p / "__init__.py").is_file()}
    reaching_in = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                names = module.split(".")
                if names[:2] != ["psych_sidecar", "domain"] or len(names) < 4:
                    continue
                if names[2] in concerns and parts[:2] != ("domain", names[2]):
                    reaching_in.append(f"{path.relative_to(ROOT)}: {module}")
    assert reaching_in == []


def test_no_test_module_imports_another() -> None:
    # What more than one module uses lives in tests/support (its docstring says so).
    importing = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            if any(m.split(".")[-1].startswith("test_") for m in modules if m.startswith("tests")):
                importing.append(f"{path.relative_to(ROOT)}: {modules[0]}")
    assert importing == []


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


def test_the_readme_s_documentation_section_lists_every_page_of_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"\]\(docs/([a-z0-9-]+\.md)\)", section))
    pages = {page.name for page in (ROOT / "docs").glob("*.md")}
    assert sorted(pages - listed) == []
    assert sorted(listed - pages) == []


def test_every_runtime_dependency_has_a_row_in_design_md_and_every_row_is_one() -> None:
    with (ROOT / "pyproject.toml").open("rb") as file:
        declared = {
            re.split(r"[\[<>=!~ ]", requirement, maxsplit=1)[0].lower()
            for requirement in tomllib.load(file)["project"]["dependencies"]
        }
    table = DESIGN.split("## Dependencies, and why each is there", 1)[1]
    named = set()
    for cell in re.findall(r"^\| ([^|]+) \|", table, re.M):
        if cell.startswith("dev:") or "not in `pyproject.toml`" in cell:
            continue
        named |= {name.split("[")[0].lower() for name in re.findall(r"`([^`]+)`", cell)}
    assert named == declared


# Modules over 500 lines, each with the reason it stays whole; this list only shrinks.
OVER_500_LINES = {
    # The settings' one schema: every setting, its default, its bounds and its documentation,
    # read by pydantic-settings from flags, environment and TOML alike.
    "config.py",
    # One algorithm: BM25F over a tool's fields and its fusion with sentence vectors, pure
    # functions over one index structure.
    "search/ranking.py",
}


def test_no_module_in_the_package_is_over_500_lines() -> None:
    sizes = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    over = {path: lines for path, lines in sizes.items() if lines > 500}
    assert {p: n for p, n in over.items() if p not in OVER_500_LINES} == {}
    # A split module leaves the list with its split.
    assert sorted(OVER_500_LINES - over.keys()) == []


# Modules that keep state per thread, and why: telemetry/tracing.py because the OpenTelemetry
# SDK calls its id generator without arguments, so the trace id chosen for the next span can
# only reach it through the thread. This list only shrinks.
THREAD_LOCALS = {"telemetry/tracing.py"}


def test_no_module_keeps_state_in_a_thread_local() -> None:
    using = {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "threading.local(" in path.read_text()
    }
    assert sorted(using - THREAD_LOCALS) == []
    assert sorted(THREAD_LOCALS - using) == []


def test_constructors_of_more_than_three_parameters_take_them_by_keyword() -> None:
    """A class's __init__ with more than three parameters takes at most one positionally (the
    thing it wraps), so no call site passes a run of values that only their order names."""
    positional_runs = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if not (isinstance(item, ast.FunctionDef) and item.name == "__init__"):
                    continue
                arguments = item.args
                positional = [a.arg for a in arguments.posonlyargs + arguments.args][1:]
                if len(positional) + len(arguments.kwonlyargs) > 3 and len(positional) > 1:
                    where = path.relative_to(PACKAGE).as_posix()
                    positional_runs.append(f"{where} {node.name}({', '.join(positional)})")
    assert positional_runs == []


def test_no_test_patches_a_module_constant() -> None:
    """A limit a test needs at another value is a parameter of what it limits: a patched
    module constant changes it for everything else in the process too, and hides the
    dependency from the signature."""
    patching = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "setattr"
                and node.args
            ):
                continue
            named = node.args[1] if len(node.args) > 1 else node.args[0]
            if isinstance(named, ast.Constant) and isinstance(named.value, str):
                name = named.value.rsplit(".", 1)[-1]
                if name.isupper():
                    patching.append(f"{path.relative_to(ROOT)}:{node.lineno} {named.value}")
    assert patching == []

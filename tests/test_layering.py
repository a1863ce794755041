"""The layers of the source tree, one-way and without an import circle:

    harness/cli.py                       the command line                                  (8)
    harness/run/                         running a check: plugin, recorder, fuzz, dispatch (7)
    harness/report/                      what a run produces: report, html, triage, diff   (6)
    properties/, distributed_tests/      the generic properties (one process; gloo ranks)  (5)
    harness/bindings/, harness/mutants/  engines bound to the catalog; the mutant zoo      (4)
    harness/catalog/                     the op catalog and the Binding an engine fills in (3)
    harness/families/                    one module per op family                          (2)
    harness/core/, harness/workers/      comparison machinery; processes that run engines  (1)
    reference/                           NumPy float64, imports nothing of the project     (0)

A module may import its own layer and the layers below it, never one above (distributed_tests may use
properties, not the other way round). Every ``import`` of the project's modules is read from the source
(top-level and inside functions), so a lazy import counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"reference": "reference", "harness": "harness", "properties": "properties",
           "distributed_tests": "distributed_tests"}
#: harness subpackage (or root module) -> layer name
HARNESS = {"core": "core", "workers": "core", "families": "families", "catalog": "catalog",
           "bindings": "engines", "mutants": "engines", "report": "report", "run": "run", "cli": "cli"}
RANK = {"reference": 0, "core": 1, "families": 2, "catalog": 3, "engines": 4, "properties": 5,
        "distributed_tests": 5, "report": 6, "run": 7, "cli": 8}


def layer(module: str) -> str:
    """``rlconform.harness.core.tolerance`` -> ``core``; test modules of properties/ and
    distributed_tests/ count as run-layer code (pytest collects them through the plugin)."""
    parts = module.split(".")
    top = parts[1]
    if top == "reference":
        return "reference"
    if top in ("properties", "distributed_tests"):
        return "run" if parts[-1].startswith("test_") or parts[-1] == "conftest" else top
    if len(parts) == 2:
        return "core"  # rlconform.harness itself (its __init__ imports nothing)
    return HARNESS[parts[2]]


def modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    out = {}
    for top, folder in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join(["rlconform", top, *parts])] = path
    return out


def imports(path: pathlib.Path, module: str) -> set[str]:
    """Project modules imported anywhere in ``path`` (relative imports resolved)."""
    found = set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n for n in names if n.startswith("rlconform."))
    return found


def graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    mods = modules(root)
    tops = {f"rlconform.{top}" for top in FOLDERS}  # `from rlconform.harness import x` imports x, not a layer
    return {m: {i for i in imports(p, m) if i in mods and i != m and i not in tops} for m, p in mods.items()}


@pytest.mark.cli
def test_modules_are_found():
    g = graph()
    assert "rlconform.harness.families.token_stats" in g and "rlconform.harness.cli" in g
    assert g["rlconform.harness.catalog.ops"], "the catalog imports the families"


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        for dep in deps:
            a, b = layer(mod), layer(dep)
            if RANK[b] > RANK[a] or (a == "properties" and b == "distributed_tests"):
                bad.append(f"{mod} ({a}) imports {dep} ({b})")
    return sorted(bad)


def import_circles(g: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for dep in sorted(g[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [])
    return cycles


def test_imports_point_down_only():
    bad = upward_imports(graph())
    assert not bad, "imports pointing up:\n" + "\n".join(bad)


def test_no_import_circle():
    cycles = import_circles(graph())
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def test_harness_root_holds_only_the_command_line():
    """Every harness module lives in the subpackage of its layer; the root keeps __init__ and cli."""
    root = sorted(p.name for p in (ROOT / "harness").glob("*.py"))
    assert root == ["__init__.py", "cli.py"], root
    packages = sorted(p.name for p in (ROOT / "harness").iterdir() if (p / "__init__.py").exists())
    assert set(packages) == set(HARNESS) - {"cli"}, packages


@pytest.mark.parametrize("package", sorted(set(HARNESS) - {"cli"}))
def test_every_layer_says_what_lives_there(package):
    """Each subpackage's __init__ opens with a docstring naming what it holds and what it may import."""
    doc = ast.get_docstring(ast.parse((ROOT / "harness" / package / "__init__.py").read_text()))
    assert doc and "import" in doc.lower(), f"harness/{package}/__init__.py needs a docstring (what, and what it imports)"


def _planted_tree(tmp_path, rel: str, line: str) -> pathlib.Path:
    for folder in FOLDERS.values():
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / rel
    target.write_text(target.read_text() + "\n" + line + "\n")
    return tmp_path


@pytest.mark.cli
def test_a_planted_upward_import_is_found(tmp_path):
    """The check reads the files: a lazy import of the command line planted in core/tolerance.py fails it."""
    root = _planted_tree(tmp_path, "harness/core/tolerance.py",
                         "def _planted():\n    from rlconform.harness.cli import main  # noqa")
    bad = upward_imports(graph(root))
    assert bad == ["rlconform.harness.core.tolerance (core) imports rlconform.harness.cli (cli)"], bad
    assert not upward_imports(graph())


def test_a_planted_circle_is_found(tmp_path):
    root = _planted_tree(tmp_path, "harness/core/opinfo.py",
                         "from rlconform.harness.core import tolerance  # noqa")
    _planted = root / "harness/core/tolerance.py"
    _planted.write_text(_planted.read_text() + "\nfrom rlconform.harness.core import opinfo  # noqa\n")
    assert any("opinfo" in c and "tolerance" in c for c in import_circles(graph(root)))
    assert not import_circles(graph())

"""The layering is one-way and has no import circle (issue 9, part 1):

    runner             harness: cli, fuzz, dispatch, pytest plugin (recorder, inflight), report writers
                       (coverage_md among them), severity / triage / measures / diff / bisect
      ↓
    checks             properties/, distributed_tests/ (distributed_tests may use properties, not back)
      ↓
    core               harness: opinfo, contracts, catalog, families/, binding, bindings/, mutants/,
                       engines, coverage, tolerance, guards, faithful, tensors, evaluation, strategies,
                       layout, pool
      ↓
    reference          reference/ (imports nothing of the project)

Every ``import`` of the project's modules is read from the source (top-level and inside functions),
so a lazy import counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"reference": "reference", "harness": "harness", "properties": "properties",
           "distributed_tests": "distributed_tests"}
RUNNER = {"cli", "fuzz", "dispatch", "pytest_plugin", "report", "html_report", "summary", "xfails", "atomic_write",
          "severity", "triage", "triage_md", "diff", "bisect", "recorder", "inflight", "coverage_md",
          "measures"}
RANK = {"reference": 0, "core": 1, "properties": 2, "distributed_tests": 2, "runner": 3}


def layer(module: str) -> str:
    """``rlconform.harness.cli`` -> ``runner``; test modules of the checks layer count as runner code
    (pytest collects them through the plugin)."""
    parts = module.split(".")
    top = parts[1]
    if top == "reference":
        return "reference"
    if top in ("properties", "distributed_tests"):
        return "runner" if parts[-1].startswith("test_") or parts[-1] == "conftest" else top
    return "runner" if parts[2] in RUNNER else "core"


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for top, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
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


def graph() -> dict[str, set[str]]:
    mods = modules()
    tops = {f"rlconform.{top}" for top in FOLDERS}  # `from rlconform.harness import x` imports x, not a layer
    return {m: {i for i in imports(p, m) if i in mods and i != m and i not in tops} for m, p in mods.items()}


def test_modules_are_found():
    g = graph()
    assert "rlconform.harness.families.token_stats" in g and "rlconform.harness.cli" in g
    assert g["rlconform.harness.catalog"], "the catalog imports the families"


def test_imports_point_down_only():
    bad = []
    for mod, deps in graph().items():
        for dep in deps:
            a, b = layer(mod), layer(dep)
            if RANK[b] > RANK[a] or (a == "properties" and b == "distributed_tests"):
                bad.append(f"{mod} ({a}) imports {dep} ({b})")
    assert not bad, "imports pointing up:\n" + "\n".join(sorted(bad))


def test_no_import_circle():
    g = graph()
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
    assert not cycles, "import circles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("mutation", ["up", "circle"])
def test_the_checks_can_fail(mutation):
    """The two checks above fail on a graph that breaks the rule (they are not vacuous)."""
    g = graph()
    if mutation == "up":
        g["rlconform.harness.tolerance"] = g["rlconform.harness.tolerance"] | {"rlconform.harness.cli"}
        with pytest.raises(AssertionError, match="pointing up"):
            globals()["graph"], old = (lambda: g), globals()["graph"]
            try:
                test_imports_point_down_only()
            finally:
                globals()["graph"] = old
    else:
        g["rlconform.harness.opinfo"] = g["rlconform.harness.opinfo"] | {"rlconform.harness.catalog"}
        with pytest.raises(AssertionError, match="circles"):
            globals()["graph"], old = (lambda: g), globals()["graph"]
            try:
                test_no_import_circle()
            finally:
                globals()["graph"] = old

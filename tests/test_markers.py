"""Every test that runs the command line, a real engine or gloo ranks carries its marker, so that
``make test-fast`` (``-m "smoke or not (cli or engines or distributed or slow)"``) leaves exactly those out.

Read from the test modules' ASTs, never by running them. A test *needs* a marker when its body, its
decorators, the module-level functions it calls or the fixtures it takes (transitively, within its module)
show one of:

* ``cli``: the ``rlconform.harness.cli`` module (a subprocess of it, its ``main``, the forked CLI server) or
  a ``ci/*.sh`` script that runs it;
* ``engines``: an import of verl, SkyRL or Megatron-core, a stock binding of one, ``--engine verl`` (or
  skyrl, megatron), a copy of an installed engine (``engine_fork``);
* ``distributed``: the gloo worker pool, ``torch.distributed``, torchrun, or ``--op`` / ``--regime`` of a
  distributed op.

No wall-clock limit is asserted anywhere: a test of the suite's speed would fail on a loaded machine.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
MARKERS = ("cli", "engines", "distributed")
ENGINES = {"verl", "skyrl", "megatron", "megatron.core", "megatron-core"}
ENGINE_BINDINGS = {f"rlconform.harness.bindings.{m}" for m in ("verl", "skyrl", "megatron", "verl_step", "skyrl_step")}
DISTRIBUTED_NAMES = {"WorkerPool", "get_pool", "run_ranks", "on_pool", "init_process_group"}
DISTRIBUTED_OPS = re.compile(r"^(vocab_parallel_\w+|cp_masked_mean|dp_metric_all_reduce|dp_masked_whiten)\b")
DISTRIBUTED_REGIME = re.compile(r"^(tp|cp|dp)\d")
CLI_STRINGS = ("rlconform.harness.cli", "rlconform-pr.sh", "rlconform-install.sh")


def _direct(node: ast.AST, cli_names: set[str]) -> set[str]:
    """The markers ``node``'s own code (decorators included) needs, without following calls."""
    need = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            s = n.value
            if any(c in s for c in CLI_STRINGS):
                need.add("cli")
            if s in ("torchrun", "torch.distributed.run"):
                need.add("distributed")
        elif isinstance(n, ast.Name):
            if n.id in cli_names or n.id == "forked_cli":
                need.add("cli")
            if n.id in DISTRIBUTED_NAMES:
                need.add("distributed")
            if n.id == "engine_fork":
                need.add("engines")
        elif isinstance(n, ast.Attribute):
            if n.attr in DISTRIBUTED_NAMES or (n.attr == "distributed" and isinstance(n.value, ast.Name)
                                               and n.value.id == "torch"):
                need.add("distributed")
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
            if isinstance(n, ast.ImportFrom) and n.module == "rlconform.harness.bindings":
                mods += [f"rlconform.harness.bindings.{a.name}" for a in n.names]
            for m in mods:
                if m.split(".")[0] in ENGINES or m in ENGINE_BINDINGS:
                    need.add("engines")
                if m == "rlconform.harness.cli":
                    need.add("cli")
                if m.startswith("torch.distributed"):
                    need.add("distributed")
        elif isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            first = n.args[0] if n.args else None
            if name in ("importorskip", "load_engine", "load_binding") and isinstance(first, ast.Constant) \
                    and first.value in ENGINES:
                need.add("engines")
        if isinstance(n, (ast.List, ast.Tuple)):
            elts = n.elts
            for a, b in zip(elts, elts[1:]):
                if isinstance(a, ast.Constant) and a.value == "--engine" and isinstance(b, ast.Constant) \
                        and b.value in ENGINES:
                    need.add("engines")
                if isinstance(a, ast.Constant) and a.value in ("--op", "--regime") and isinstance(b, ast.Constant) \
                        and isinstance(b.value, str) and (DISTRIBUTED_OPS.match(b.value) or DISTRIBUTED_REGIME.match(b.value)):
                    need.add("distributed")
    return need


def _cli_names(tree: ast.Module) -> set[str]:
    """Names a module binds to the CLI module or its ``main``."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == "rlconform.harness":
            names |= {a.asname or a.name for a in n.names if a.name == "cli"}
        if isinstance(n, ast.ImportFrom) and n.module == "rlconform.harness.cli":
            names |= {a.asname or a.name for a in n.names}
    return names


def _markers_of(decorators, out: set[str]) -> set[str]:
    for d in decorators:
        for n in ast.walk(d):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark":
                out.add(n.attr)
    return out


def _module_markers(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets):
            _markers_of([stmt.value], out)
    return out


def required_and_present(path: pathlib.Path) -> dict[str, tuple[set[str], set[str], int]]:
    """test name -> (markers it needs, markers it carries, line)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    cli_names = _cli_names(tree)
    helpers = {s.name: s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    direct = {name: _direct(fn, cli_names) for name, fn in helpers.items()}

    def uses(fn: ast.AST) -> set[str]:
        names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names |= {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        return {n for n in names if n in helpers}

    closure: dict[str, set[str]] = {}

    def need_of(name: str, stack=()) -> set[str]:
        if name in closure:
            return closure[name]
        if name in stack:
            return direct[name]
        out = set(direct[name])
        for other in uses(helpers[name]) - {name}:
            out |= need_of(other, stack + (name,))
        closure[name] = out
        return out

    mod_markers = _module_markers(tree)
    result = {}
    tests = [(s, set()) for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for cls in (s for s in tree.body if isinstance(s, ast.ClassDef) and s.name.startswith("Test")):
        cls_markers = _markers_of(cls.decorator_list, set())
        tests += [(m, cls_markers) for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for fn, extra in tests:
        if not fn.name.startswith("test_"):
            continue
        need = _direct(fn, cli_names)
        for other in uses(fn):
            need |= need_of(other)
        present = _markers_of(fn.decorator_list, set(mod_markers) | extra)
        result[fn.name] = (need & set(MARKERS), present, fn.lineno)
    return result


def _test_modules():
    return sorted(p for p in TESTS.glob("test_*.py") if p.name != pathlib.Path(__file__).name)


def test_every_test_carries_the_markers_of_what_it_runs():
    missing = []
    checked = 0
    for path in _test_modules():
        for name, (need, present, line) in required_and_present(path).items():
            checked += 1
            if need - present:
                missing.append(f"{path.name}:{line} {name}: add @pytest.mark.{', @pytest.mark.'.join(sorted(need - present))}")
    assert checked > 500, f"only {checked} tests read: the check would pass in silence"
    assert not missing, "\n".join(missing)


def test_the_markers_are_registered():
    text = (ROOT / "pyproject.toml").read_text()
    for m in (*MARKERS, "slow", "smoke"):
        assert re.search(rf'^\s*"{m}: ', text, re.M), m


def test_the_reader_sees_each_kind_of_test(tmp_path):
    """The rules on a planted module: each indicator gives its marker, through a helper and a fixture too."""
    src = '''
import subprocess, sys, pytest
from rlconform.harness.workers.pool import WorkerPool

def _run(*args):
    return subprocess.run([sys.executable, "-m", "rlconform.harness.cli", *args])

@pytest.fixture
def pool():
    return WorkerPool(2)

def test_cli():
    _run("list-ops")

def test_engine():
    verl = pytest.importorskip("verl")

def test_engine_flag():
    _ = ["--engine", "skyrl"]

def test_ranks(pool):
    pass

def test_plain():
    assert 1 + 1 == 2

@pytest.mark.cli
def test_marked():
    _run("--version")
'''
    p = tmp_path / "test_planted.py"
    p.write_text(src)
    got = {k: v[0] for k, v in required_and_present(p).items()}
    assert got == {"test_cli": {"cli"}, "test_engine": {"engines"}, "test_engine_flag": {"engines"},
                   "test_ranks": {"distributed"}, "test_plain": set(), "test_marked": {"cli"}}
    assert required_and_present(p)["test_marked"][1] == {"cli"}


def test_no_test_asserts_a_wall_clock_budget():
    """Speed goals are benchmarks; a test's pass must not depend on the machine's load. A time may only be
    compared with a named deadline the code under test enforces, or a slack of a minute or more that only
    catches a hang (``*_DEADLINE_S``, ``SLACK_S``)."""
    pattern = re.compile(r"assert[^\n]*(?:elapsed|wall|duration|time\.monotonic\(\)|perf_counter\(\))[^\n]*<")
    hits = [f"{p.name}:{i}: {line.strip()}" for p in _test_modules()
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line) and not re.search(r"\b[A-Z_]*(DEADLINE_S|SLACK_S)\b", line)]
    assert not hits, "\n".join(hits)


# ------------------------------------------------------------------------------------ every module has a fast test
PACKAGE_DIRS = {"reference": "rlconform.reference", "harness": "rlconform.harness", "properties": "rlconform.properties",
                "distributed_tests": "rlconform.distributed_tests"}
#: modules that cannot have a fast test, and why (``make test`` tests each)
WITHOUT_FAST_TEST = {
    **{m: "imports a real engine (verl, SkyRL, Megatron-core), which `make test-fast` does not install"
       for m in ENGINE_BINDINGS},
    "rlconform.distributed_tests.ranks": "runs only on gloo ranks (tests/test_distributed_mutants.py)",
    "rlconform.distributed_tests.test_distributed": "the distributed property test a check collects on its ranks",
    "rlconform.distributed_tests.conftest": "pytest's conftest of the distributed property test",
}
#: modules that only a check runs (the pytest plugin's engine-worker half, the generic property test it collects):
#: the smoke check of `make test-fast` (a check of a mutant, in the CLI's process) runs them
SMOKE_CHECK = ("test_report.py", "test_report_schema_and_reproducer")
RUN_BY_THE_SMOKE_CHECK = ("rlconform.harness.run.plugin_worker", "rlconform.properties.test_properties")


def _package_modules() -> dict[str, pathlib.Path]:
    out = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _named_modules(tree: ast.AST, modules, package: str = "") -> set[str]:
    """The package modules a source names: imports (``from pkg import module`` too; relative ones from
    ``package``) and dotted strings."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and (n.module or n.level):
            base = n.module or ""
            if n.level:
                parts = package.split(".")[:len(package.split(".")) - (n.level - 1)]
                base = ".".join(parts + ([n.module] if n.module else []))
            names |= {base} | {f"{base}.{a.name}" for a in n.names}
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("rlconform."):
            names.add(n.value)
    return names & set(modules)


def _registry_modules(uses: set[str]) -> set[str]:
    """Modules a fast test reaches through a registry it enumerates: every mutant (``mutant_names``), every op's
    family and reference function (the catalog ``OPS`` with the reference engine)."""
    out = set()
    if "mutant_names" in uses:
        from rlconform.harness.bindings.load import mutant_names

        out |= {f"rlconform.harness.mutants.{n}" for n in mutant_names()} | {"rlconform.harness.mutants"}
    if {"OPS", "load_engine"} <= uses:
        import rlconform.reference as R
        from rlconform.harness.catalog.ops import OPS, family_of

        for op in OPS.values():
            family = family_of(op.name)
            out |= {family.strategy.__module__}
            if family.evaluate is not None:
                out.add(family.evaluate.__module__)
            fn = getattr(R, getattr(op.reference, "__name__", ""), None)
            if fn is not None:
                out.add(fn.__module__)
    return out


def modules_with_a_fast_test() -> tuple[dict[str, pathlib.Path], dict[str, str]]:
    """(every package module, module -> the fast test module that covers it). A test module with at least one
    test that ``make test-fast`` runs covers the modules it names or enumerates; a private module (``_name``)
    is covered through a covered module of its package that imports it."""
    modules = _package_modules()
    covered: dict[str, str] = {}
    for path in _test_modules():
        found = required_and_present(path).values()
        if not any("smoke" in present or not (need | present) & {*MARKERS, "slow"} for need, present, _ in found):
            continue
        tree = ast.parse(path.read_text())
        uses = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        for m in _named_modules(tree, modules) | _registry_modules(uses):
            covered.setdefault(m, path.name)
    changed = True
    while changed:
        changed = False
        for m in list(covered):
            package = m if modules[m].name == "__init__.py" else m.rsplit(".", 1)[0]
            for private in _named_modules(ast.parse(modules[m].read_text()), modules, package):
                if private.rsplit(".", 1)[-1].startswith("_") and private not in covered:
                    covered[private] = covered[m]
                    changed = True
    for m in modules:  # a package is covered through its covered modules
        if m not in covered and modules[m].name == "__init__.py" and any(c.startswith(m + ".") for c in covered):
            covered[m] = "its modules"
    return modules, covered


def test_every_module_has_a_fast_test():
    modules, covered = modules_with_a_fast_test()
    assert len(modules) > 150, f"only {len(modules)} modules found: the check would pass in silence"
    need, present, _ = required_and_present(TESTS / SMOKE_CHECK[0])[SMOKE_CHECK[1]]
    assert "smoke" in present and "cli" in need, f"{SMOKE_CHECK}: not the smoke check any more"
    for m in RUN_BY_THE_SMOKE_CHECK:
        covered.setdefault(m, "::".join(SMOKE_CHECK))
    missing = sorted(set(modules) - set(covered) - set(WITHOUT_FAST_TEST))
    assert not missing, "modules that no test of `make test-fast` names (import it in a fast test):\n" + \
        "\n".join(missing)
    stale = sorted(m for m in WITHOUT_FAST_TEST if m not in modules or (m in covered and m not in ENGINE_BINDINGS))
    assert not stale, f"WITHOUT_FAST_TEST lists modules that are gone or have a fast test now: {stale}"

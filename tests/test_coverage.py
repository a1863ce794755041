"""The coverage table: every public function of an engine's numerics modules and every
registry entry is bound to an op, justified, or listed as unbound, from the module contents at run time.

A fake engine (a package written to a temporary folder) stands for verl / SkyRL: its functions are the
items, a registry dict its registered callables; the binding's adapters wrap them as the real bindings do.
The real engines' tables are checked at the end (every item bound or justified, no stale justification).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import textwrap

import pytest

from rlconform.harness.catalog.binding import Binding, Coverage, Lazy, Variants
from rlconform.harness.catalog.coverage import compared_strings, inventory

ENGINE = "fakeeng_cov"
NUMERICS = f"{ENGINE}.numerics"

NUMERICS_SRC = '''
import torch
from {engine}.helpers import imported_helper  # re-imported: not an item of this module

REGISTRY = {{}}


def register(name):
    def deco(fn):
        REGISTRY[name] = fn
        return fn
    return deco


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum().clamp(min=1)


def masked_sum(values, mask):
    return (values * mask).sum()


@register("k1")
def kl_k1(logprob, ref, mask):
    return logprob - ref


@register("k3")
def kl_k3(logprob, ref, mask):
    r = ref - logprob
    return r.exp() - r - 1


@register("k2")
@register("mse")
def kl_k2(logprob, ref, mask):
    return 0.5 * (logprob - ref) ** 2


def pad_to_length(x, n):
    return x


def _private_helper(x):
    return x


class Stats:
    def aggregate(self, values):
        return sum(values) / len(values)

    def append(self, value):
        return value


class Kind:
    pass
'''


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """A package ``fakeeng_cov`` (``numerics``, ``helpers``) importable from ``tmp_path``; returns a function
    that appends source to ``numerics.py`` and re-imports it (what a fork's new commit does)."""
    pkg = tmp_path / ENGINE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("def imported_helper(x):\n    return x\n")
    (pkg / "numerics.py").write_text(NUMERICS_SRC.format(engine=ENGINE))
    monkeypatch.syspath_prepend(str(tmp_path))

    def purge():
        for name in [m for m in sys.modules if m == ENGINE or m.startswith(ENGINE + ".")]:
            del sys.modules[name]

    purge()

    def add(source: str):
        with open(pkg / "numerics.py", "a") as fh:
            fh.write("\n\n" + textwrap.dedent(source))
        purge()
        importlib.invalidate_caches()

    yield add
    purge()


def _registry():
    return dict(importlib.import_module(NUMERICS).REGISTRY)


def _kl_variants():
    """The registry as a binding sees it: k1 / k3 by their callables, k2 by name (its callable is shared with
    ``mse``), ``mse`` unchecked."""
    mod = importlib.import_module(NUMERICS)

    def bind(name):
        fn = mod.REGISTRY[name]

        def kl(logprob, ref, mask):
            return fn(logprob, ref, mask)

        return kl

    def bind_by_name(name):
        def kl(logprob, ref, mask):
            return mod.REGISTRY[name](logprob, ref, mask)

        return kl

    return Variants({"k1": bind("k1"), "k3": bind("k3"), "k2": bind_by_name("k2")},
                    unchecked={"mse": "the same function as k2"})


def _masked_sum_loader():
    mod = importlib.import_module(NUMERICS)

    def masked_sum(values, mask):
        return mod.masked_sum(values, mask)  # the module object in a cell, the name read

    return masked_sum


def _binding(not_bound=None) -> Binding:
    return Binding(
        name="fake",
        ops={
            "masked_mean": Lazy(f"{NUMERICS}:masked_mean"),
            "masked_sum": Lazy(loader=_masked_sum_loader),
            "kl_estimator": Lazy(loader=_kl_variants),
        },
        coverage=Coverage(
            modules=(ENGINE,),
            registries={f"{NUMERICS}.REGISTRY": _registry},
            registry_ops={f"{NUMERICS}.REGISTRY": "kl_estimator"},
            not_bound=dict(not_bound if not_bound is not None else {
                f"{NUMERICS}.pad_to_length": "not numerics: padding",
                f"{NUMERICS}.register": "not numerics: registration decorator",
                f"{NUMERICS}.Stats.aggregate": "no catalog op yet: metric statistics",
                f"{NUMERICS}.Stats.append": "not numerics: appends",
                f"{NUMERICS}.Kind": "not numerics: a marker class",
                f"{NUMERICS}.REGISTRY['mse']": "the same function as k2",
                f"{ENGINE}.helpers.imported_helper": "not numerics: identity",
            }),
        ),
    )


def _by_name(inv):
    return {it.name: it for it in inv.items}


def test_the_inventory_lists_public_items_of_the_modules(fake_engine):
    items = _by_name(inventory(_binding()))
    assert f"{NUMERICS}.masked_mean" in items and f"{NUMERICS}.kl_k3" in items
    assert f"{NUMERICS}.Stats.aggregate" in items and items[f"{NUMERICS}.Stats.aggregate"].kind == "method"
    assert items[f"{NUMERICS}.Kind"].kind == "class"  # a class without public methods is listed itself
    assert f"{NUMERICS}._private_helper" not in items
    # a re-imported function is listed where it is defined (the helpers module), not where it is imported
    assert f"{NUMERICS}.imported_helper" not in items and f"{ENGINE}.helpers.imported_helper" in items
    assert {f"{NUMERICS}.REGISTRY[{n!r}]" for n in ("k1", "k2", "k3", "mse")} <= set(items)


def test_bound_items_name_their_op_and_variant(fake_engine):
    inv = inventory(_binding())
    items = _by_name(inv)
    assert items[f"{NUMERICS}.masked_mean"].bound_to == ["masked_mean"]  # a Lazy target: the function itself
    assert items[f"{NUMERICS}.masked_sum"].bound_to == ["masked_sum"]  # module in a closure cell + name read
    assert items[f"{NUMERICS}.REGISTRY['k1']"].bound_to == ["kl_estimator[k1]"]  # its callable in a closure
    assert items[f"{NUMERICS}.kl_k3"].bound_to == ["kl_estimator[k3]"]
    # k2 and mse share one callable: only the name in the closure tells which entry is bound
    assert items[f"{NUMERICS}.REGISTRY['k2']"].bound_to == ["kl_estimator[k2]"]
    assert items[f"{NUMERICS}.REGISTRY['mse']"].status == "justified"
    # the function registered under a bound entry is bound to the same variant
    assert items[f"{NUMERICS}.kl_k2"].bound_to == ["kl_estimator[k2]"]
    assert all(it.status == "bound" for it in inv.items if it.bound_to)
    assert inv.counts() == {"unbound": 0, "bound": 8, "justified": 7}, [(i.name, i.status) for i in inv.items]
    assert inv.stale == [] and inv.errors == []


def test_a_justified_item_shows_its_reason(fake_engine):
    items = _by_name(inventory(_binding()))
    assert items[f"{NUMERICS}.pad_to_length"].status == "justified"
    assert items[f"{NUMERICS}.pad_to_length"].reason == "not numerics: padding"
    # `.append` of a list an adapter calls is not the class's method: generic names need identity
    assert items[f"{NUMERICS}.Stats.append"].status == "justified"


def test_a_function_added_at_run_time_is_unbound_and_listed_first(fake_engine):
    fake_engine('''
        def masked_max(values, mask):
            return values.masked_fill(mask == 0, float("-inf")).max()


        @register("k4")
        def kl_k4(logprob, ref, mask):
            return (logprob - ref).abs()
    ''')
    inv = inventory(_binding())
    unbound = [it.name for it in inv.unbound()]
    assert set(unbound) == {f"{NUMERICS}.masked_max", f"{NUMERICS}.kl_k4", f"{NUMERICS}.REGISTRY['k4']"}
    assert [it.name for it in inv.items[:3]] == unbound  # unbound first
    assert inv.counts()["unbound"] == 3


def test_stale_justifications_are_reported(fake_engine):
    nb = dict(_binding().coverage.not_bound)
    nb[f"{NUMERICS}.masked_mean"] = "claims it is not bound"
    nb[f"{NUMERICS}.renamed_away"] = "names nothing"
    inv = inventory(_binding(nb))
    assert any("renamed_away" in s for s in inv.stale)
    assert any(s.startswith(f"{NUMERICS}.masked_mean is bound") for s in inv.stale)
    assert _by_name(inv)[f"{NUMERICS}.masked_mean"].status == "bound"


def test_a_submodule_that_does_not_import_is_listed_from_its_source(fake_engine, tmp_path):
    (tmp_path / ENGINE / "broken.py").write_text(
        "import fakeeng_cov_not_installed\n\n\ndef broken_mean(values, mask):\n    return values.mean()\n\n\n"
        "class Reducer:\n    def reduce(self, x):\n        return x\n")
    inv = inventory(_binding())
    items = _by_name(inv)
    module = items[f"{ENGINE}.broken"]
    assert module.kind == "module" and module.status == "unbound" and "fakeeng_cov_not_installed" in module.reason
    assert items[f"{ENGINE}.broken.broken_mean"].status == "unbound"  # read from the source: still listed
    assert items[f"{ENGINE}.broken.Reducer.reduce"].kind == "method"
    assert items[f"{NUMERICS}.masked_mean"].status == "bound"  # the package's other modules are unaffected
    assert any(e.startswith(f"module {ENGINE}.broken") for e in inv.errors)


def test_an_unimportable_module_is_an_item_and_an_unresolvable_op_an_error(fake_engine):
    b = _binding()
    b.coverage = Coverage(modules=(ENGINE, "fakeeng_cov_missing"), registries=b.coverage.registries,
                          registry_ops=b.coverage.registry_ops, not_bound=b.coverage.not_bound)
    b.ops = {**b.ops, "entropy": Lazy("fakeeng_cov_missing:entropy")}
    inv = inventory(b)
    missing = _by_name(inv)["fakeeng_cov_missing"]
    assert missing.kind == "module" and missing.status == "unbound" and "cannot import" in missing.reason
    assert any(e.startswith("op entropy could not be resolved") for e in inv.errors)


def test_compared_strings_reads_the_modes_of_a_dispatching_function():
    def kl(logprob, ref, mode):
        if mode in ("kl", "k1"):
            return logprob - ref
        if mode == "abs":
            return (logprob - ref).abs()
        if "low" == mode:
            return None
        other = "not a mode"
        raise ValueError(other)

    assert compared_strings(kl, "mode") == ["kl", "k1", "abs", "low"]


# ------------------------------------------------------------------------------- CLI and report
BINDING_FILE = '''
import importlib
from rlconform.harness.catalog.binding import Binding, Coverage, Lazy

NOT_BOUND = {not_bound!r}

binding = Binding(
    name="fake",
    ops={{"masked_mean": Lazy("fakeeng_cov.numerics:masked_mean")}},
    coverage=Coverage(modules=("fakeeng_cov.numerics",), not_bound=NOT_BOUND),
)
'''
_ALL_JUSTIFIED = {f"{NUMERICS}.{n}": "justified in the test" for n in (
    "masked_sum", "kl_k1", "kl_k2", "kl_k3", "pad_to_length", "register", "Stats.aggregate", "Stats.append",
    "Kind")}


def _cli(tmp_path, capsys, not_bound, *extra):
    from rlconform.harness.cli import main

    path = tmp_path / "fake_binding.py"
    path.write_text(BINDING_FILE.format(not_bound=not_bound))
    code = main(["coverage", "--engine", str(path), "--engine-path", str(tmp_path), *extra])
    return code, capsys.readouterr()


@pytest.mark.cli
def test_cli_strict_exits_1_when_something_is_unbound(fake_engine, tmp_path, capsys):
    nb = dict(_ALL_JUSTIFIED)
    del nb[f"{NUMERICS}.pad_to_length"]
    code, out = _cli(tmp_path, capsys, nb, "--format", "md", "--strict")
    assert code == 1
    assert "## Unbound (1)" in out.out and f"`{NUMERICS}.pad_to_length`" in out.out
    assert "unbound" in out.err
    code, out = _cli(tmp_path, capsys, nb, "--format", "md")  # without --strict: 0
    assert code == 0


@pytest.mark.cli
def test_cli_prints_a_complete_table_and_exits_0(fake_engine, tmp_path, capsys):
    code, out = _cli(tmp_path, capsys, _ALL_JUSTIFIED, "--format", "json", "--strict")
    assert code == 0, out.err
    record = json.loads(out.out)
    assert record["counts"] == {"unbound": 0, "bound": 1, "justified": 9}
    mean = next(it for it in record["items"] if it["short"] == "masked_mean")
    assert mean["bound_to"] == ["masked_mean"] and mean["status"] == "bound"
    code, out = _cli(tmp_path, capsys, _ALL_JUSTIFIED, "--format", "table")
    assert code == 0 and "masked_mean" in out.out and "justified in the test" in out.out


@pytest.mark.cli
def test_cli_engine_without_coverage_is_a_usage_error(capsys):
    from rlconform.harness.cli import main

    assert main(["coverage", "--engine", "reference", "--format", "md"]) == 2
    assert "declares no coverage" in capsys.readouterr().err


def test_report_carries_the_coverage(tmp_path, fake_engine):
    from rlconform.harness.catalog.coverage import coverage_record
    from rlconform.harness.report.html_report import render_html
    from rlconform.harness.report.writer import ReportWriter

    fake_engine("def masked_std(values, mask):\n    return values.std()\n")
    record = coverage_record(_binding())
    w = ReportWriter(str(tmp_path), engine={"name": "fake", "spec": "fake.py"}, run={}, coverage=record)
    w.write()
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["coverage"]["counts"] == record["counts"] and record["counts"]["unbound"] == 1
    md = (tmp_path / "report.md").read_text()
    assert "### Coverage of the engine's numerics" in md and f"`{NUMERICS}.masked_std`" in md
    assert "unbound 1" in md
    assert "coverage of the engine's numerics: bound 8" in render_html(doc)
    # a report without coverage (a bare pytest run, an old report) renders as before
    w2 = ReportWriter(str(tmp_path / "b"), engine={"name": "fake", "spec": "fake.py"}, run={})
    (tmp_path / "b").mkdir()
    w2.write()
    assert "Coverage" not in (tmp_path / "b" / "report.md").read_text()


# ---------------------------------------------------------------------------------- real engines
@pytest.mark.engines
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("engine,package", [("verl", "verl"), ("skyrl", "skyrl"), ("megatron", "megatron.core")])
def test_every_numerics_function_of_the_real_engines_is_bound_or_justified(engine, package):
    """For the installed releases: nothing unbound, no stale justification."""
    try:
        found = importlib.util.find_spec(package.split(".")[0]) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        pytest.skip(f"{engine} is not installed: run `install/engines.sh .venv/bin/python {engine}`")
    from rlconform.harness.bindings.load import load_engine

    inv = inventory(load_engine(engine))
    assert [it.name for it in inv.unbound()] == []
    assert inv.stale == []
    assert inv.counts()["bound"] > 0

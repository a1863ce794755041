"""Whole-package discovery: the rule finds numerics functions anywhere in an engine's source,
without importing it, and coverage lists them, so a fork's new numerics outside the binding's module list is
``unbound`` and fails ``--strict``."""

from __future__ import annotations

import sys
import textwrap

import pytest

from rlconform.harness.catalog.binding import Binding, Coverage, Lazy
from rlconform.harness.catalog.coverage import inventory
from rlconform.harness.catalog.discovery import discover, package_dir

PKG = "fakeeng_disc"

SOURCES = {
    "__init__.py": "raise RuntimeError('discovery must never import the engine')\n",
    "losses.py": '''
        import torch
        import math

        REGISTRY = {}

        def register_loss(name):
            def deco(fn):
                REGISTRY[name] = fn
                return fn
            return deco

        def token_mean(x, mask):
            return (x * mask).sum() / mask.sum()

        def entropy(logits):
            return -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)

        @register_loss("plain")
        def plain_loss(x):
            return x

        def pad(x, n):
            return x + [0] * n

        def scalar_log(x):
            return math.log(x)

        def uses_helper(x):
            return _helper(x)

        def _helper(x):
            return x.exp()

        def _private_numerics(x):
            return x.exp()

        class Tracker:
            def log(self, metrics):
                self.run.log(metrics)

        class _Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.log()

            @staticmethod
            def backward(ctx, g):
                return g
    ''',
    "_private.py": "import torch\n\ndef hidden(x):\n    return x.exp()\n",
    "dist.py": '''
        import torch.distributed as dist

        def gather_only(x, out):
            dist.all_gather(out, x)
            return out

        def reduce_sum(x):
            dist.all_reduce(x)
            return x
    ''',
}


@pytest.fixture
def fake_pkg(tmp_path, monkeypatch):
    pkg = tmp_path / PKG
    pkg.mkdir()
    for name, src in SOURCES.items():
        (pkg / name).write_text(textwrap.dedent(src))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
        del sys.modules[name]


def test_the_rule_finds_numerics_and_only_numerics(fake_pkg):
    found, errors = discover(PKG)
    assert errors == [] and PKG not in sys.modules  # read, never imported (its __init__ raises)
    got = {f.qualname: f.signals for f in found}
    assert got["token_mean"] == ("masked reduction",)
    assert got["entropy"] == ("softmax",)
    assert got["plain_loss"] == ("registered",)
    assert got["uses_helper"] == ("exp/log",)  # a private helper's signal passes to its public caller
    assert got["_Scale.forward"] == ("exp/log", "autograd.Function")
    assert got["_Scale.backward"] == ("autograd.Function",)  # the gradient of a numerics forward
    assert got["reduce_sum"] == ("collective",)
    for absent in ("pad", "scalar_log", "_private_numerics", "_helper", "Tracker.log", "gather_only",
                   "register_loss", "hidden"):
        assert absent not in got, absent
    site = next(f for f in found if f.qualname == "token_mean")
    assert site.file == f"{PKG}/losses.py" and site.module == f"{PKG}.losses"
    assert package_dir(PKG) == str(fake_pkg)


def test_coverage_lists_what_discovery_finds_outside_the_module_list(fake_pkg):
    """A fork's numerics in a module the binding never named: unbound (and a prefix justification or a bound
    op changes that)."""
    (fake_pkg / "__init__.py").write_text("")
    binding = Binding(name="fake", ops={"masked_mean": Lazy(f"{PKG}.losses:token_mean")},
                      coverage=Coverage(modules=(f"{PKG}.dist",)))
    inv = inventory(binding)
    by = {it.name: it for it in inv.items}
    assert by[f"{PKG}.losses.token_mean"].status == "bound" and not by[f"{PKG}.losses.token_mean"].listed
    assert by[f"{PKG}.losses.entropy"].status == "unbound"
    assert by[f"{PKG}.losses.entropy"].site == f"{PKG}/losses.py:16"
    assert by[f"{PKG}.dist.gather_only"].listed and by[f"{PKG}.dist.gather_only"].signals == []
    assert inv.discovery["packages"] == [PKG] and inv.discovery["beyond_modules"] == 6
    binding.coverage = Coverage(modules=(f"{PKG}.dist",), not_bound_under={f"{PKG}.losses": "model forward: test"},
                                not_bound={f"{PKG}.dist.gather_only": "not numerics: test",
                                           f"{PKG}.dist.reduce_sum": "not numerics: test"})
    inv = inventory(binding)
    assert inv.unbound() == [] and inv.stale == []
    assert {it.name: it.reason for it in inv.items}[f"{PKG}.losses.entropy"] == "model forward: test"


def test_a_file_read_before_is_not_parsed_again_and_an_edited_one_is(fake_pkg, tmp_path, monkeypatch):
    """The readings kept by file content give what parsing gives; an edit is read afresh; without the cache
    (RLCONFORM_NO_CACHE) every file is parsed."""
    import ast

    import rlconform.harness.catalog.discovery as D

    monkeypatch.setenv("RLCONFORM_CACHE_DIR", str(tmp_path / "cache"))
    fields = lambda found: [(f.module, f.qualname, f.kind, f.file, f.line, f.signals, f.path) for f in found]  # noqa: E731
    parsed, _ = discover(PKG)
    first, _ = discover(PKG, reuse=True)
    assert fields(first) == fields(parsed) and (tmp_path / "cache" / "discovery" / f"{PKG}.json").is_file()
    parses = []
    real_parse = ast.parse
    monkeypatch.setattr(D.ast, "parse", lambda *a, **k: parses.append(a[1]) or real_parse(*a, **k))
    again, _ = discover(PKG, reuse=True)
    assert fields(again) == fields(parsed) and parses == []  # every file's reading reused
    assert all(f.node is None for f in again)
    losses = fake_pkg / "losses.py"
    losses.write_text(losses.read_text() + "\n\ndef added_entropy(logits):\n    return logits.logsumexp(-1)\n")
    edited, _ = discover(PKG, reuse=True)
    assert parses == [str(losses)]  # only the edited file
    assert fields(edited) == fields(discover(PKG)[0]) and "added_entropy" in {f.qualname for f in edited}
    monkeypatch.setenv("RLCONFORM_NO_CACHE", "1")
    parses.clear()
    discover(PKG, reuse=True)
    assert str(losses) in parses

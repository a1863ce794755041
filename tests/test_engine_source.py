"""Reading an engine's code without importing its module, and telling a binding's own error apart from the
engine's, on planted packages in the test's process: the source compiler of harness/bindings/source.py,
the frame and name readers of properties/binding_errors.py, the pinned example generation of
harness/core/determinism.py and the TP / CP / DP layout of harness/core/layout.py."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from rlconform.harness.bindings.source import engine_function, module_file
from rlconform.harness.core.determinism import pin_generation
from rlconform.harness.core.layout import Layout, parse_regime, row_chunks, zigzag_index
from rlconform.properties.binding_errors import innermost_file, missing_name


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A package ``planted_engine`` whose ``trainer`` module cannot be imported (a missing dependency)."""
    pkg = tmp_path / "planted_engine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text(textwrap.dedent("""
        import math
        import a_dependency_this_machine_lacks as missing

        SCALE = 2.0  # module-level statements never run


        def token_mean(values):
            return math.fsum(values) / len(values)


        def uses_missing(x):
            return missing.f(x)


        class Step:
            def normaliser(self, mask):
                return max(1, sum(mask))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("planted_engine")]:
        monkeypatch.delitem(sys.modules, name)
    return pkg


def test_a_function_of_a_module_that_does_not_import_runs_from_its_source(planted):
    with pytest.raises(ModuleNotFoundError):
        __import__("planted_engine.trainer")
    assert module_file("planted_engine.trainer") == planted / "trainer.py"
    token_mean = engine_function("planted_engine.trainer", "token_mean")
    assert token_mean([1.0, 2.0, 6.0]) == 3.0
    assert token_mean.__code__.co_filename == str(planted / "trainer.py")  # tracebacks point into the engine
    assert engine_function("planted_engine.trainer", "Step.normaliser")(None, [0, 0]) == 1
    with pytest.raises(NameError):  # a name whose module cannot be had raises where the engine uses it
        engine_function("planted_engine.trainer", "uses_missing")(1.0)
    with pytest.raises(AttributeError, match="defines no"):
        engine_function("planted_engine.trainer", "not_there")
    with pytest.raises(ModuleNotFoundError):
        module_file("no_such_engine_anywhere.trainer")


def test_the_binding_error_readers_name_the_innermost_file_and_the_missing_name(planted):
    namespace: dict = {}
    exec(compile("def boom():\n    raise TypeError(\"f() got an unexpected keyword argument 'dp_size'\")\n",
                 str(planted / "adapter.py"), "exec"), namespace)
    try:
        namespace["boom"]()
    except TypeError as exc:
        assert innermost_file(exc) == str(planted / "adapter.py")
        assert missing_name(exc) == "dp_size"
    assert missing_name(AttributeError("x", name="compute_entropy")) == "compute_entropy"
    assert innermost_file(ValueError("never raised")) is None


def test_example_generation_is_pinned_once_and_stays_pinned():
    first = pin_generation()
    assert pin_generation() == first  # idempotent


def test_the_layout_of_ranks_is_megatrons():
    layout, data = parse_regime("tp2cp2_moderate")
    assert (layout, data, layout.world, layout.name) == (Layout(2, 2, 1), "moderate", 4, "tp2cp2")
    assert layout.tp_groups() == [[0, 1], [2, 3]] and layout.cp_groups() == [[0, 2], [1, 3]]
    assert all(layout.rank(*layout.coords(r)) == r for r in range(layout.world))
    for bad in ("tp2", "moderate", "tp0_moderate"):
        with pytest.raises(ValueError):
            parse_regime(bad)
    # CP = 2 zigzag: rank 0 holds chunks 0 and 3 of 4, rank 1 chunks 1 and 2
    assert zigzag_index(8, 2, 0).tolist() == [0, 1, 6, 7] and zigzag_index(8, 2, 1).tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError):
        zigzag_index(6, 2, 0)
    assert [c.tolist() for c in row_chunks(5, 2)] == [[0, 1, 2], [3, 4]]
    assert np.array_equal(np.sort(np.concatenate([zigzag_index(12, 3, r) for r in range(3)])), np.arange(12))

"""Every op of the catalog, OpInfo-style, in the test's process and in seconds (part of ``make test-fast``).

* each single-process op, each of its properties: the reference engine passes two derandomized examples of
  the property's first finding in float64 (the family's strategy draws, its evaluation calls the engine and
  the exact reference, the property judges), and the example survives its case file unchanged;
* each distributed op (checked on gloo ranks, which ``make test`` runs): each of its regimes draws an example,
  which survives its case file unchanged.

The whole catalog, every dtype and regime, through the command line: ``test_reference_engine_passes_everything``
in tests/test_mutants.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from rlconform.harness.bindings.load import load_engine, variant_info
from rlconform.harness.catalog.ops import OPS, strategy_for
from rlconform.harness.run.selection import selected_findings
from rlconform.properties.case import Case, load_case, save_case
from rlconform.properties.checks import run_check_here

REFERENCE = load_engine("reference")
#: (op, property) of every single-process finding the reference provides (a property checked only under a second
#: implementation's regimes, ``implementations_agree``, exists where the engine has one: the mutants' and engines')
SINGLE = sorted({(op, prop) for op, prop, _, _ in selected_findings(REFERENCE.provided_ops(), distributed=False,
                                                                     variants=variant_info(REFERENCE)[0])})
DISTRIBUTED = sorted(op.name for op in OPS.values() if op.distributed)
EXAMPLES = settings(max_examples=2, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def reference():
    return REFERENCE


def _first_finding(reference, op: str, prop: str) -> tuple[str, str]:
    """The property's first float64 finding that the reference provides (its variants and implementations)."""
    cases = [(d, r) for _, p, d, r in selected_findings(reference.provided_ops(), (op,), (prop,),
                                                        variants=variant_info(reference)[0]) if p == prop]
    assert cases, f"{op}.{prop}: no finding"  # a property with no finding is never checked
    return next(((d, r) for d, r in cases if d == "float64"), cases[0])


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or hasattr(a, "shape"):
        # a case file holds floats as float64 and integers as int64, exactly (a family casts to the finding's
        # dtype when it evaluates): the same kind and the same values
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype.kind == b.dtype.kind and \
            np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return a == b


def _round_trips(case: Case, path) -> None:
    save_case(case, str(path))
    back = load_case(str(path))
    assert (back.op, back.property, back.dtype, back.regime) == (case.op, case.property, case.dtype, case.regime)
    assert _same(case.inputs, back.inputs), f"{case.finding_id}: the case file changes the example"


def test_the_catalog_is_read():
    assert len(SINGLE) >= 60 and len(DISTRIBUTED) >= 5, (len(SINGLE), DISTRIBUTED)
    assert {op.name for op in OPS.values() if not op.distributed} == {op for op, _ in SINGLE}


@pytest.mark.parametrize("op,prop", SINGLE, ids=[f"{o}.{p}" for o, p in SINGLE])
def test_the_reference_passes_each_property_of_each_op(reference, op, prop, tmp_path):
    dtype, regime = _first_finding(reference, op, prop)
    judged = []

    @EXAMPLES
    @given(inputs=strategy_for(op, dtype, regime))
    def run(inputs):
        case = Case(op, prop, dtype, regime, inputs)
        outcome = run_check_here(reference, case)
        assert outcome.verdict != "discrepancy", f"{case.finding_id}: {outcome.message}"
        if not judged:
            _round_trips(case, tmp_path / "case.json")
        judged.append(outcome.verdict)

    run()
    assert judged, f"{op}.{prop}: no example judged"


@pytest.mark.parametrize("op", DISTRIBUTED)
def test_each_regime_of_a_distributed_op_draws_an_example_its_case_file_keeps(op, tmp_path):
    regimes = sorted({(p, d, r) for p, d, r in OPS[op].findings(None) if d == "float32"}, key=lambda f: f[2])
    assert regimes, f"{op}: no float32 finding"
    drawn = []
    for prop, dtype, regime in regimes:

        @settings(EXAMPLES, max_examples=1)
        @given(inputs=strategy_for(op, dtype, regime))
        def draw(inputs):
            _round_trips(Case(op, prop, dtype, regime, inputs), tmp_path / "case.json")
            drawn.append(regime)

        draw()
    assert set(drawn) == {r for _, _, r in regimes}

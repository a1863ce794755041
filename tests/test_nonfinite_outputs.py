"""Whatever an engine returns is data to judge: ±inf, NaN and huge outputs make NaN / inf findings, never a
crash of rlconform's comparison blamed on the engine; an exception rlconform's own yardstick raises is
``error``, not ``crash`` (:mod:`rlconform.harness.core.blame`)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rlconform.harness.core.blame import OwnCodeRaised, own_code_raised
from rlconform.harness.core.evaluation import Compared, Evaluation, MetricFlow
from rlconform.harness.core.tolerance import ATOL
from rlconform.properties import generic
from rlconform.reference.exact_sum import exact_sum

INF, NAN = math.inf, math.nan
#: engine outputs a broken engine may return, against a finite reference of 1.0 and 2.0
HOSTILE = {
    "+inf": [INF, 2.0], "-inf": [-INF, 2.0], "both infinities": [INF, -INF], "nan": [NAN, 2.0],
    "nan and inf": [NAN, INF], "huge": [1e308, -1e308], "float64 max": [1.7976931348623157e308, 2.0],
}
PROPERTIES = [generic.matches_reference, generic.finite_where_reference_finite, generic.partition_invariant,
              generic.mask_invariant, generic.implementations_agree, generic.non_destructive]


def test_exact_sum_follows_ieee_where_fsum_raises():
    assert exact_sum([1e16, 1.0, -1e16]) == 1.0  # still exactly rounded
    assert math.isnan(exact_sum([INF, -INF]))
    assert math.isnan(exact_sum([NAN, 1.0]))
    assert exact_sum([INF, 1.0]) == INF and exact_sum(iter([-INF, 3.0])) == -INF
    assert exact_sum([1e308, 1e308]) == INF and exact_sum([-1e308, -1e308, 1.0]) == -INF
    assert exact_sum([]) == 0.0
    with pytest.raises(ValueError):
        math.fsum([INF, -INF])  # the case exact_sum exists for


@pytest.mark.parametrize("kind,dtype,name", [(k, d, n) for k in ATOL for d in ("float64", "float32", "bfloat16", "float16")
                                             for n in HOSTILE])
def test_every_property_judges_non_finite_engine_outputs_without_raising(kind, dtype, name):
    engine = np.array(HOSTILE[name])
    ref = np.array([1.0, 2.0])
    faithful = np.array([1.0, 2.0])
    compared = [Compared("value", engine, ref, faithful, dtype, kind),
                Compared("gradient", engine[::-1].copy(), ref, None, dtype, kind, only_where=np.array([True, False]))]
    ev = Evaluation(values=compared[:1], gradients=compared[1:],
                    alternatives=[("another partition", [Compared("value", ref, ref, faithful, dtype, kind),
                                                         Compared("gradient", engine, ref, None, dtype, kind)])],
                    metrics=MetricFlow(emitted={"m"}, final={"m": float(engine[0])}, emitted_to_final={"m": "m"}))
    for prop in PROPERTIES:
        outcome = prop(ev)  # must not raise
        assert isinstance(outcome.ok, bool)
    assert not generic.matches_reference(ev).ok  # a non-finite or huge output is a failure, shown as such
    assert not generic.partition_invariant(ev).ok


def _raise_in_reference():
    from rlconform.reference import reductions

    return reductions.masked_sum(np.ones((1, 2)), np.ones((1, 3)))  # mismatched shapes: the reference raises


def test_an_exception_of_the_yardstick_is_rlconforms_and_one_reading_engine_output_is_not():
    with pytest.raises(Exception) as info:
        _raise_in_reference()
    where = own_code_raised(info.value)
    assert where is not None and where.startswith("rlconform.reference.")
    try:
        from rlconform.harness.core.tensors import as_numpy

        as_numpy({"not": "a tensor"})  # a family reading a malformed engine output
    except Exception as exc:  # noqa: BLE001
        assert own_code_raised(exc) is None
    else:
        raise AssertionError("as_numpy read a dict")
    from rlconform.harness.run.recorder import classify

    assert classify(OwnCodeRaised(where, "ValueError: x")) == "error"


AGG_LOSS_INF = '''
import torch
from rlconform.harness.core import faithful as F
from rlconform.harness.catalog.binding import AggLoss, Binding


def _loss(loss_mat, mask, mode, info):
    # +inf on micro-batches of an even number of rows, -inf on the others: the combined loss is NaN
    out = F.agg_loss_micro(loss_mat, mask, mode, info)
    return out + (float("inf") if loss_mat.shape[0] % 2 == 0 else float("-inf"))


binding = Binding(name="agg_loss_inf", ops={"agg_loss": AggLoss(loss=_loss, modes=("token-mean",))})
'''


@pytest.mark.cli
@pytest.mark.slow
def test_agg_loss_returning_opposite_infinities_is_a_nan_row_not_a_crash(tmp_path):
    """Opposite infinities over micro-batches made ``math.fsum`` raise in rlconform's combination of the
    engine's contributions; the finding read as the engine's ``crash:ValueError``."""
    import forked_cli

    engine = tmp_path / "agg_loss_inf.py"
    engine.write_text(AGG_LOSS_INF)
    out = tmp_path / "o"
    proc = forked_cli.run(["check", "--engine", str(engine), "--op", "agg_loss", "--property", "matches_reference",
                           "--dtype", "float32", "--out", str(out), "-n", "1"], timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    findings = json.loads((out / "report.json").read_text())["findings"]
    assert findings and {f["status"] for f in findings} == {"discrepancy"}, [(f["status"], f["message"][:200])
                                                                             for f in findings]
    assert not any("fsum" in (f.get("message") or "") for f in findings)




def test_a_message_quotes_the_worst_elements_own_errors():
    """The worst element (largest error over tolerance) is named with its own absolute / relative error and
    ulps, not with the largest of other elements (a marginal message read "rel err 1" beside a ~ok element)."""
    from rlconform.harness.core.tolerance import compare

    c = compare(np.array([2.0, 1e-3]), np.array([1.0, 1e-4]), None, dtype="float32", kind="reduction")
    assert c.worst_index == 0 and c.max_rel_err > 8  # element 1 is 9× off relatively, element 0 is the worst
    text = c.describe()
    assert "at flat index 0: abs err 1, rel err 1, " in text, text

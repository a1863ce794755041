"""The metric_statistics op: every statistic (mean, min, max, sum, count, per-sequence
lengths), every value type (Python number, 0-d tensor, NumPy scalar) and counts above 2²⁴ through the
engine's reducer; metric_integrity fails on a dropped, printed or narrowed value. Each mutant is caught on a
hand-built case and the reference engine passes the same case; real engine defects are pinned with numbers."""

from __future__ import annotations

import importlib
import types

import numpy as np
import pytest
import torch

import rlconform.reference as R
from rlconform.harness.bindings.reference import binding as REFERENCE
from rlconform.harness.core.evaluation import EngineCrash, Evaluation, MetricFlow
from rlconform.harness.families import metric_statistics as MS
from rlconform.properties.generic import JUDGES, metric_integrity

# three rows (lengths 2, 1, 0), a garbage 9.0 at a masked position; two DP ranks, rank 1 with two micro-batches
VALUES = np.array([[0.5, 0.25, 9.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
MASK = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)
PARTITIONS = [[[[[0, 1]], [[1, 2], [2, 3]]]], [[[[0, 3]]]], [[[[0, 2]], [[2, 3]]]]]
SMALL = {"values": VALUES, "mask": MASK, "partitions": PARTITIONS, "garbage": float("nan")}
# 2²³ + 1 and 2²³ tokens: 16 777 217 in the step, odd, not a float32 number; one empty row
LARGE = {"row_values": np.array([0.5, 0.25, 0.0]), "lengths": [2**23 + 1, 2**23, 0], "t_big": 2**23 + 1,
         "partitions": [[[[[0, 1]], [[1, 3]]]]]}


def case(prop: str, regime: str = "python_values", dtype: str = "float32", inputs=None):
    inputs = inputs if inputs is not None else (LARGE if regime == MS.LARGE else SMALL)
    return types.SimpleNamespace(op="metric_statistics", property=prop, dtype=dtype, regime=regime, inputs=inputs)


def judge(binding, c):
    return JUDGES[c.property](MS.evaluate(binding, c))


def mutant(name: str):
    return importlib.import_module(f"rlconform.harness.mutants.{name}")


# ------------------------------------------------------------------------------------------- reference
def test_reference_statistics():
    r = R.metric_statistics(VALUES, MASK)
    assert r == {"sum": 2.75, "count": 3, "mean": 2.75 / 3, "min": 0.25, "max": 2.0, "n_seq": 3, "len_min": 0,
                 "len_max": 2, "len_mean": 1.0}
    assert isinstance(r["count"], int) and isinstance(r["len_max"], int)


def test_reference_run_length_form_equals_the_expanded_batch():
    mult = np.array([[3, 1], [2, 5]])
    vals, mask = np.array([[0.5, 1.5], [2.0, 7.0]]), np.array([[1, 1], [1, 0]], bool)
    expanded_v = np.array([[0.5] * 3 + [1.5] + [0.0] * 3, [2.0] * 2 + [0.0] * 5])
    expanded_m = np.array([[1] * 4 + [0] * 3, [1] * 2 + [0] * 5], bool)
    assert R.metric_statistics(vals, mask, mult) == R.metric_statistics(expanded_v, expanded_m)


def test_reference_count_is_exact_above_two_to_the_24():
    values, mask = MS.large_tensors(LARGE, "float32")
    assert values.stride() == (1, 0) and mask.dtype == torch.bool  # no 2²⁴-element value array
    lengths = np.array(LARGE["lengths"])
    r = R.metric_statistics(np.array([[0.5], [0.25], [0.0]]), (lengths > 0)[:, None], lengths[:, None])
    assert r["count"] == 16_777_217 and r["sum"] == 0.5 * (2**23 + 1) + 0.25 * 2**23
    assert float(np.float32(r["count"])) == 16_777_216.0  # why the regime exists


# ------------------------------------------------------------------------------------ reference engine
@pytest.mark.parametrize("regime,dtype", [("python_values", "float32"), ("tensor_values", "float64"),
                                          ("numpy_values", "float32"), ("python_values", "bfloat16")])
@pytest.mark.parametrize("prop", ["matches_reference", "partition_invariant", "mask_invariant", "metric_integrity"])
def test_reference_engine_passes(prop, regime, dtype):
    out = judge(REFERENCE, case(prop, regime, dtype))
    assert out.ok, out.message


def test_reference_engine_passes_large_counts():
    out = judge(REFERENCE, case("matches_reference", MS.LARGE))
    assert out.ok, out.message


def test_missing_statistic_is_a_problem():
    import dataclasses

    from rlconform.harness.bindings.reference import statistics_pipeline
    from rlconform.harness.catalog.binding import Binding

    partial = dataclasses.replace(statistics_pipeline, stats={"mean": "x_mean"})
    b = Binding("partial", {"metric_statistics": partial})
    out = judge(b, case("matches_reference"))
    assert not out.ok and "maps no final key" in out.message


# ---------------------------------------------------------------------------------------------- mutants
def test_masked_min_mutant_is_caught():
    b = mutant("ms_masked_min").binding
    out = judge(b, case("matches_reference"))
    assert not out.ok and "x_min (min)" in out.message and "engine 0.0 vs reference 0.25" in out.message
    assert not judge(b, case("mask_invariant")).ok  # NaN · 0 at the masked position reaches the max


def test_count_fp32_mutant_is_caught_only_above_two_to_the_24():
    b = mutant("ms_count_fp32").binding
    assert judge(b, case("matches_reference")).ok  # 3 tokens: float32 is exact
    out = judge(b, case("matches_reference", MS.LARGE))
    assert not out.ok and "engine 16777216.0 vs reference 16777217.0" in out.message


def test_dropping_mutant_is_caught():
    out = judge(mutant("ms_drops_non_float").binding, case("metric_integrity"))
    assert not out.ok and "emitted key 'x_count' never reached the final dict" in out.message


def test_printing_mutant_is_caught_for_tensors_and_numpy_scalars():
    b = mutant("ms_prints_instead").binding
    assert judge(b, case("metric_integrity", "python_values")).ok
    for regime in ("tensor_values", "numpy_values"):
        out = judge(b, case("metric_integrity", regime))
        assert not out.ok and "was printed instead of logged" in out.message, out.message


def test_narrowing_mutant_is_caught():
    out = judge(mutant("ms_narrowed_type").binding, case("metric_integrity", "python_values", "float64"))
    assert not out.ok and "changed in type" in out.message and "numpy.float32" in out.message


# ------------------------------------------------------------------------------------- metric_integrity
def flow(final, emitted_values, integral=(), printed=""):
    ev = Evaluation()
    ev.metrics = MetricFlow(set(emitted_values), final, {}, dict(emitted_values), frozenset(integral), printed)
    return metric_integrity(ev)


def test_integrity_accepts_numbers_that_keep_their_type():
    assert flow({"n": 3, "x": 0.5, "m": np.int64(4), "f": 6.0}, {"n": 1, "x": 0.25, "m": 2, "f": 3},
                integral={"n", "m", "f"}).ok


@pytest.mark.parametrize("final,emitted,integral,needle", [
    ({}, {"n": 1}, (), "never reached the final dict"),
    ({}, {"n": torch.tensor(1)}, (), "printed instead of logged"),
    ({"n": torch.tensor(3)}, {"n": 1}, (), "not a number"),
    ({"n": 2.5}, {"n": 1}, {"n"}, "changed in type"),
    ({"n": np.float32(3.0)}, {"n": 1}, {"n"}, "changed in type"),
    ({"x": np.float32(0.5)}, {"x": 0.5}, (), "narrowed below float64"),
    ({"x": np.float32(0.5)}, {"x": torch.tensor(0.5, dtype=torch.float64)}, (), "narrowed below float64"),
])
def test_integrity_fails(final, emitted, integral, needle):
    printed = "Metrics for key n are not all numbers: [tensor(1)]" if needle.startswith("printed") else ""
    out = flow(final, emitted, integral, printed)
    assert not out.ok and needle in out.message, out.message
    (lost,) = out.clauses  # the record says which emitted key was lost and what the engine printed instead
    assert (lost.kind, lost.what) == ("metric", "lost metric")
    assert lost.key == ("n" if needle in ("never reached the final dict", "printed instead of logged") else "")
    assert lost.printed == printed


def test_integrity_keeps_float32_emitted_as_float32():
    assert flow({"x": np.float32(0.5)}, {"x": np.float32(0.5)}).ok


# ---------------------------------------------------------------------------------- real engine defects
def _skyrl():
    pytest.importorskip("skyrl")
    from rlconform.harness.bindings import skyrl

    return skyrl


@pytest.mark.engines
def test_skyrl_min_reads_masked_positions_as_zero():
    """worker_utils.compute_minibatch_rollout_logprob_diff_metrics: ``(abs_diff * loss_mask).min()``."""
    sk = _skyrl()
    fn = sk._skyrl(sk.WORKER_UTILS, "compute_minibatch_rollout_logprob_diff_metrics")
    logp = torch.tensor([[0.5, 0.25, 0.0]])
    out = fn(logp, torch.zeros_like(logp), torch.tensor([[1.0, 1.0, 0.0]]))
    assert out["minibatch_rollout_logprobs_abs_diff_min"] == 0.0  # the true min over the two tokens: 0.25
    got = judge(sk.binding, case("matches_reference"))
    assert "engine 0.0 vs reference 0.25" in got.message


@pytest.mark.engines
def test_skyrl_reduce_metrics_prints_and_drops_tensors_and_numpy_scalars(capsys):
    sk = _skyrl()
    reduce_metrics = sk._skyrl(sk.WORKER_UTILS, "reduce_metrics")
    out = reduce_metrics({"a": [torch.tensor(0.5)], "b": [np.float32(0.5)], "c": [np.int64(3)], "d": [0.5]})
    assert out == {"d": 0.5}
    assert "Metrics for key a are not all numbers" in capsys.readouterr().out
    got = judge(sk.binding, case("metric_integrity", "tensor_values"))
    assert not got.ok and "was printed instead of logged" in got.message


@pytest.mark.engines
def test_skyrl_all_reduce_carries_counts_in_float32():
    """``DistributedStrategy.all_reduce`` turns every number into ``torch.Tensor([v])`` (float32): a step of
    16 777 217 tokens logs 16 777 216.0."""
    sk = _skyrl()
    got = judge(sk.binding, case("matches_reference", MS.LARGE))
    assert "policy/num_tokens_loss (count)" in got.message and "engine 16777216.0 vs reference 16777217.0" in got.message
    strategy = sk._InProcessDPStrategy([{"num_tokens_loss": 2**23 + 1}, {"num_tokens_loss": 2**23}])
    worker_utils = sk._skyrl(sk.WORKER_UTILS)
    out = worker_utils.all_reduce_metrics({"num_tokens_loss": 2**23 + 1}, strategy, sum_loss_metrics=True)
    assert out == {"num_tokens_loss": 16777216.0} and isinstance(out["num_tokens_loss"], float)


def _verl():
    pytest.importorskip("verl")
    from verl.utils.metric import AggregationType, Metric

    return AggregationType, Metric


@pytest.mark.engines
def test_verl_metric_rejects_numpy_scalars():
    """verl.utils.metric.Metric.append accepts int, float, Tensor, ndarray: a NumPy float32 / int64 scalar
    (what np.mean / np.max of a float32 / int array returns) raises."""
    agg, metric = _verl()
    for value in (np.float32(0.5), np.int64(3)):
        with pytest.raises(ValueError, match="Unsupported value type"):
            metric(agg.MEAN, value)
    assert metric(agg.MEAN, np.float64(0.5)).values == [0.5]  # a float subclass passes
    from rlconform.harness.bindings.verl import binding

    with pytest.raises(EngineCrash, match="numpy.float32"):
        MS.evaluate(binding, case("matches_reference", "numpy_values", "float32"))


@pytest.mark.engines
def test_verl_sum_means_over_dp_ranks():
    """verl's AggregationType.SUM folds DP ranks by their *mean* (Metric.aggregate_dp): it is a sum only for
    values that carry the DP factor (losses scaled by dp_size); a raw per-rank count is divided by DP."""
    agg, metric = _verl()
    ranks = [metric(agg.SUM), metric(agg.SUM)]
    ranks[0].extend([10, 1])
    ranks[1].extend([20, 2])
    assert metric.aggregate_dp(ranks) == 16.5  # Σ over ranks and micro-batches: 33


@pytest.mark.engines
def test_verl_metric_rejects_the_list_its_docstring_allows():
    """``Metric(aggregation, value)``: "value: Optional initial value(s) to add. Can be a single numeric value
    or a list of values" — a list raises (``__init__`` calls ``append``, not ``extend``)."""
    agg, metric = _verl()
    with pytest.raises(ValueError, match="Unsupported value type: <class 'list'>"):
        metric(agg.MEAN, [1.0, 2.0])


@pytest.mark.engines
def test_verl_passes_counts_above_two_to_the_24():
    pytest.importorskip("verl")
    from rlconform.harness.bindings.verl import binding

    ev = MS.evaluate(binding, case("matches_reference", MS.LARGE))
    count = [c for c in ev.values if "(count)" in c.label]
    assert len(count) == 1 and float(count[0].engine) == 16_777_217.0

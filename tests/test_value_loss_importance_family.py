"""The ``value_loss`` and ``importance_ratio`` families: their reference-engine paths, their
yardsticks and the checks they make, on hand-computed inputs (values written from the formulas, never
by calling the reference); the engines' registries bound completely (engines marker)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlconform.harness.catalog.binding import Binding, LossVariants, Variants
from rlconform.harness.catalog.ops import OPS
from rlconform.harness.core.opinfo import MASK_INVARIANT, MATCHES_REFERENCE, PARTITION_INVARIANT
from rlconform.harness.families import importance_ratio as IR
from rlconform.harness.families import value_loss as VL


def _vl_case(prop=MATCHES_REFERENCE, variant="token-mean", partitions=([(0, 1), (1, 2)],)):
    # row 0: v = 1, v_old = 0, R = 0 -> L1 = 1, v_clip = 0.2, L2 = 0.04: L = 1, not clipped, dL/dv = 2
    #        v = 0.5, v_old = 0, R = 1 -> L1 = 0.25, v_clip = 0.2, L2 = 0.64: L = 0.64, clipped, dL/dv = 0
    # row 1: one valid token v = 0.1, v_old = 0, R = 0.1 -> L = 0, inside the clip range; one padded position
    inputs = {"vpreds": np.array([[1.0, 0.5], [0.1, 7.0]]), "values": np.array([[0.0, 0.0], [0.0, 3.0]]),
              "returns": np.array([[0.0, 1.0], [0.1, -2.0]]), "mask": np.array([[True, True], [True, False]]),
              "partitions": list(partitions), "garbage": math.nan, "variant": variant}
    return SimpleNamespace(inputs=inputs, property=prop, dtype="float64")


def _ref_binding(**ops):
    from rlconform.harness.bindings.reference import binding as reference

    return Binding(name="t", ops={**reference.ops, **ops})


def test_value_loss_hand_computed_token_mean_over_partitions():
    from rlconform.harness.bindings.reference import binding

    ev = VL.evaluate(binding, _vl_case(PARTITION_INVARIANT))
    assert not ev.problems
    loss = ev.values[0]
    assert loss.engine == pytest.approx(0.5 * (1.0 + 0.64 + 0.0) / 3, rel=1e-15)
    clipfrac = [c for c in ev.values if "vf_clipfrac" in c.label][0]
    assert clipfrac.engine == pytest.approx(1 / 3)
    grad = ev.gradients[0].engine
    np.testing.assert_allclose(grad[0], [0.5 * 2.0 / 3, 0.0], atol=1e-15)
    for _, alt in ev.alternatives:  # two micro-batches: same loss, gradient, metric (token-weighted fold)
        assert alt[0].engine == pytest.approx(loss.engine, rel=1e-15)


def test_value_loss_seq_mean_token_mean_row_weights():
    from rlconform.harness.bindings.reference import binding

    ev = VL.evaluate(binding, _vl_case(variant="seq-mean-token-mean"))
    # rows: mean L = (1 + 0.64) / 2 and 0; two non-empty rows
    assert ev.values[0].engine == pytest.approx(0.5 * ((1.0 + 0.64) / 2 + 0.0) / 2, rel=1e-15)


def test_value_loss_mean_of_micro_means_is_a_partition_dependence():
    from rlconform.harness.mutants.vl_clipfrac_mean_of_means import binding
    from rlconform.properties import generic as G

    ev = VL.evaluate(binding, _vl_case(PARTITION_INVARIANT))
    # micro-batches: row 0 clipfrac 1/2, row 1 clipfrac 0 -> mean of means 1/4, not 1/3
    alt = [c for c in ev.alternatives[0][1] if "vf_clipfrac" in c.label][0]
    assert alt.engine == pytest.approx(0.25)
    assert not G.partition_invariant(ev).ok


def test_value_loss_missing_metric_and_graph_are_problems():
    def detached(vpreds, values, returns, response_mask, info):
        return torch.zeros((), dtype=vpreds.dtype), {}

    b = _ref_binding(value_loss=LossVariants({"token-mean": detached}, combine_metrics=lambda parts: {}))
    ev = VL.evaluate(b, _vl_case())
    assert any("no autograd graph" in str(p) for p in ev.problems)
    assert any("vf_clipfrac" in str(p) for p in ev.problems)


def test_value_loss_fp32_yardstick_models_rounding_ties():
    # |R| = 1e15: fp32 rounds v - R and v_clip - R to the same value, torch.maximum splits the gradient
    # (half of the exact 2(v - R)); the yardstick must admit it, the float64 reference does not tie.
    arrays = {"vpreds": np.array([[1.0]]), "values": np.array([[0.0]]), "returns": np.array([[-1e15]])}
    mask = np.array([[True]])
    ref = VL.reference("token-sum", arrays["vpreds"], arrays["values"], arrays["returns"], mask)
    loss, grad, _ = VL.fp32_path("token-sum", arrays, mask, "float32")
    assert ref[1][0, 0] == pytest.approx(1.0 + 1e15)  # the unclipped term is larger: ½·2(v − R)
    assert grad[0, 0] == pytest.approx(0.5 * (1.0 + 1e15), rel=1e-6)
    fa = VL.yardstick("token-sum", arrays, mask, "float32", ref)
    assert abs(fa[1][0, 0] - ref[1][0, 0]) >= 0.4e15


def test_value_loss_variants_are_catalog_variants():
    assert set(VL.VARIANTS) == set(OPS["value_loss"].variants)
    assert VL.VARIANTS["unclipped"][0] is None


def _ir_case(variant, lp, old, mask, prop=MATCHES_REFERENCE, dtype="float32"):
    return SimpleNamespace(inputs={"log_prob": np.array(lp), "old_log_prob": np.array(old), "mask": np.array(mask),
                                   "garbage": math.nan, "variant": variant}, property=prop, dtype=dtype)


def test_importance_ratio_extreme_log_ratio_is_clamped_with_zero_gradient():
    from rlconform.harness.bindings.reference import binding

    ev = IR.evaluate(binding, _ir_case("token", [[-0.5, -1.0]], [[-100.5, -1.0]], [[True, True]]))
    assert not ev.problems
    assert ev.values[0].engine[0, 0] == pytest.approx(math.exp(20.0), rel=1e-6)
    assert ev.values[0].engine[0, 1] == 1.0
    np.testing.assert_array_equal(ev.gradients[0].engine[0], [0.0, 1.0])


def test_importance_ratio_sequence_levels_hand_computed():
    from rlconform.harness.bindings.reference import binding

    lp, old, mask = [[-0.1, -0.3, -5.0]], [[-0.2, -0.5, -1.0]], [[True, True, False]]  # Δ = 0.1, 0.2 | pad
    geo = IR.evaluate(binding, _ir_case("sequence_geometric", lp, old, mask, dtype="float64"))
    prod = IR.evaluate(binding, _ir_case("sequence_product", lp, old, mask, dtype="float64"))
    assert geo.values[0].engine[0, :2] == pytest.approx([math.exp(0.15)] * 2, rel=1e-15)
    assert prod.values[0].engine[0, :2] == pytest.approx([math.exp(0.3)] * 2, rel=1e-15)
    # d Σ_t s / d lp_t = n · s / n = s (geometric); n · S (product)
    assert geo.gradients[0].engine[0, :2] == pytest.approx([math.exp(0.15)] * 2, rel=1e-15)
    assert prod.gradients[0].engine[0, :2] == pytest.approx([2 * math.exp(0.3)] * 2, rel=1e-15)
    tis = IR.evaluate(binding, _ir_case("sequence_tis", [[-0.1, -0.1]], [[-1.5, -1.5]], [[True, True]],
                                        dtype="float64"))
    assert list(tis.values[0].engine[0]) == [5.0, 5.0] and list(tis.gradients[0].engine[0]) == [0.0, 0.0]


def test_importance_ratio_yardstick_widens_with_sequence_length():
    lp = np.full((1, 64), -0.5)
    old = np.full((1, 64), -0.6)
    mask = np.ones((1, 64), bool)
    ref, _ = IR.reference("sequence_product", lp, old, mask)
    fa, _ = IR.yardstick("sequence_product", lp, old, mask, "float32")
    # 64 tokens, each shifted by 2^-24·1.1: the log-sum moves by ~4.2e-6
    assert fa[0, 0] / ref[0, 0] - 1 == pytest.approx(64 * 1.1 * 2.0**-24, rel=1e-3)


def test_importance_ratio_detached_engine_is_a_problem_unless_forward_only():
    def detached(log_prob, old_log_prob, mask):
        return torch.exp((log_prob - old_log_prob).clamp(-20, 20)).detach()

    case = _ir_case("token", [[-0.5]], [[-0.6]], [[True]])
    ev = IR.evaluate(_ref_binding(importance_ratio=Variants({"token": detached})), case)
    assert any("no autograd graph" in str(p) for p in ev.problems)
    b = Binding(name="t", ops={"importance_ratio": Variants({"token": detached})},
                forward_only=frozenset({"importance_ratio"}))
    ev = IR.evaluate(b, case)
    assert not ev.problems and not ev.gradients and ev.values


def test_importance_ratio_mask_invariant_catches_nan_times_mask():
    from rlconform.harness.mutants.ir_nan_times_mask import binding
    from rlconform.properties import generic as G

    case = _ir_case("sequence_product", [[-0.5, -0.1]], [[-0.6, -0.2]], [[True, False]], prop=MASK_INVARIANT)
    ev = IR.evaluate(binding, case)
    assert G.matches_reference(ev).ok
    assert not G.mask_invariant(ev).ok


@pytest.mark.engines
def test_verl_value_loss_and_is_weights_bound_completely():
    from verl.trainer.ppo import rollout_corr_helper

    from rlconform.harness.bindings import verl

    vl = verl.binding.resolve("value_loss")
    assert set(vl.impls) == set(VL.VARIANTS) - {"unclipped"}
    ir = verl.binding.resolve("importance_ratio")
    assert set(ir.impls) <= set(IR.VARIANTS) and ir.impls
    for name in rollout_corr_helper.SUPPORTED_ROLLOUT_RS_OPTIONS:
        assert ir.unchecked[f"rollout_rs={name}"]
    assert "importance_ratio" in verl.binding.detached  # a constant for the policy gradient


@pytest.mark.engines
def test_skyrl_value_loss_and_tis_bound_completely():
    import dataclasses

    from rlconform.harness.bindings import skyrl
    from rlconform.harness.bindings._compat import import_skyrl

    vl = skyrl.binding.resolve("value_loss")
    assert set(vl.impls) == {"seq-mean-token-mean", "unclipped"}
    ir = skyrl.binding.resolve("importance_ratio")
    assert set(ir.impls) == {"token_tis", "sequence_tis"}
    fields = {f.name for f in dataclasses.fields(import_skyrl("skyrl.train.config").OffPolicyCorrectionConfig)}
    for name in fields - set(skyrl._TIS_FIELDS):
        assert ir.unchecked[f"off_policy_correction.{name}"]


# ------------------------------------------------------------- engine findings pinned on small inputs
@pytest.mark.engines
def test_skyrl_sequence_tis_leaks_nan_from_masked_positions():
    """SkyRL ``compute_tis_ratio(tis_ratio_type="sequence")`` sums ``Δ * loss_mask``: NaN at a padded
    position makes the row's weight NaN (verl's ``masked_sum`` selects and stays finite)."""
    from rlconform.harness.bindings import skyrl, verl

    lp = torch.tensor([[-0.5, float("nan")]])
    old = torch.tensor([[-0.6, -0.2]])
    mask = torch.tensor([[True, False]])
    assert torch.isnan(skyrl.binding.resolve("importance_ratio").get("i", "sequence_tis")(lp, old, mask)[0, 0])
    w = verl.binding.resolve("importance_ratio").get("i", "sequence_tis")(lp, old, mask)
    assert float(w[0, 0]) == pytest.approx(math.exp(0.1), rel=1e-6)


@pytest.mark.engines
@pytest.mark.parametrize("engine", ["verl", "skyrl"])
def test_vf_clipfrac_is_a_mean_of_micro_batch_means(engine):
    """Both critics log the clip fraction per micro-batch and average the micro-batches' values: micro-batch A
    clips 1 of 1 token, B 0 of 3 -> 1/2 logged, 1/4 is the mini-batch's clip fraction."""
    import importlib

    impl = importlib.import_module(f"rlconform.harness.bindings.{engine}").binding.resolve("value_loss")
    assert impl.combine_metrics([({"vf_clipfrac": 1.0}, 1), ({"vf_clipfrac": 0.0}, 3)])["vf_clipfrac"] == 0.5


@pytest.mark.engines
def test_skyrl_vf_clipfrac_counts_a_token_inside_the_clip_range():
    """SkyRL writes v_clip = v_old + clamp(v − v_old, ±ε): in fp32 that is v + 1 ulp here, so a token 0.04
    inside the clip range counts as clipped (verl's clip_by_value returns v itself)."""
    from rlconform.harness.bindings import skyrl, verl
    from rlconform.harness.core.contracts import BatchInfo

    v = torch.tensor([[0.028250733390450478]])
    old = torch.tensor([[-0.013210486620664597]])
    ret = torch.tensor([[0.013831793330609798]])
    mask = torch.tensor([[True]])
    info = BatchInfo(dp_size=1, global_nnz=1, global_batch_size=1, global_nonempty_seqs=1, num_micro_batches=1,
                     loss_scale_factor=1.0)
    _, sky = skyrl.binding.resolve("value_loss").get("v", "seq-mean-token-mean")(v, old, ret, mask, info)
    _, ver = verl.binding.resolve("value_loss").get("v", "seq-mean-token-mean")(v, old, ret, mask, info)
    assert sky["vf_clipfrac"] == 1.0 and ver["vf_clipfrac"] == 0.0


@pytest.mark.engines
def test_verl_is_metrics_divide_by_zero_when_every_weight_is_zero():
    """verl ``compute_is_metrics``' effective sample size is ``1.0 / masked_mean(w_norm²).item()``: a batch whose
    applied IS weights are all 0 raises ZeroDivisionError — IcePop rejecting every token (fp32 here), or
    e^-20 underflowing fp16 (found by importance_ratio.finite_where_reference_finite.float16)."""
    from verl.trainer.ppo import rollout_corr_helper as rc

    old, rollout, mask = torch.tensor([[-0.1, -0.2]]), torch.tensor([[-3.0, -4.0]]), torch.tensor([[True, True]])
    with pytest.raises(ZeroDivisionError):
        rc.compute_rollout_correction_and_rejection_mask(old, rollout, mask, rollout_is="token",
                                                         rollout_is_threshold="0.5_5.0")


def test_importance_ratio_icepop_band_zeroes_weight_and_gradient_outside_it():
    """IcePop (verl ``rollout_is_threshold="0.5_2.0"``): a ratio outside [0.5, 2] weighs 0 and passes no
    gradient; inside, the plain ratio. A TIS cap and a band together, or a band not 0 < lower < upper, raise."""
    import rlconform.reference as R

    lp, old, m = np.array([[-0.1, -2.0, -1.0, -0.5]]), np.array([[-1.0, -1.0, -1.5, -0.5]]), np.ones((1, 4), bool)
    w = R.importance_ratio(lp, old, m, band=(0.5, 2.0))
    np.testing.assert_allclose(w, [[0.0, 0.0, math.exp(0.5), 1.0]], rtol=1e-15)
    g = R.importance_ratio_grad(lp, old, m, band=(0.5, 2.0))
    np.testing.assert_allclose(g, [[0.0, 0.0, math.exp(0.5), 1.0]], rtol=1e-15)
    for bad in (dict(band=(0.5, 2.0), cap=2.0), dict(band=(2.0, 0.5)), dict(band=(0.0, 1.0))):
        with pytest.raises(ValueError):
            R.importance_ratio(lp, old, m, **bad)


def test_importance_ratio_icepop_draws_stay_off_the_band_edges_and_reach_every_branch():
    from hypothesis import given, settings

    from rlconform.harness.core.branches import branch_counts

    seen = set()

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(IR.inputs("float32", "token_icepop", "moderate"))
    def draws(x):
        d = (x["log_prob"] - x["old_log_prob"])[x["mask"]]
        assert (np.abs(np.abs(d) - math.log(2.0)) >= IR.BAND_MARGIN * 0.99).all()
        seen.update(n for n, c in branch_counts(IR.BRANCHES["token_icepop"], x).items() if c)

    draws()
    assert {"ratio inside the band [0.5, 2]", "ratio above 2 (weight 0)", "ratio below 0.5 (weight 0)"} <= seen


def test_a_crash_with_every_weight_zero_names_icepop_or_the_underflow():
    """verl's ZeroDivisionError row: its trigger is what zeroes every weight, not the dtype or the log-ratio's
    size."""
    icepop = SimpleNamespace(inputs={"log_prob": np.array([[-0.1, -5.0]]), "old_log_prob": np.array([[-3.0, -1.0]]),
                                     "mask": np.array([[True, True]]), "variant": "token_icepop"}, dtype="float32")
    assert "outside the IcePop band [0.5, 2]" in IR.trigger(icepop, "", "crash:ZeroDivisionError")
    under = SimpleNamespace(inputs={"log_prob": np.array([[-30.0]]), "old_log_prob": np.array([[-0.5]]),
                                    "mask": np.array([[True]]), "variant": "token_tis"}, dtype="float16")
    assert IR.trigger(under, "", "crash:ZeroDivisionError").startswith("every weight underflows to 0 in float16")
    inside = SimpleNamespace(inputs=dict(icepop.inputs, log_prob=np.array([[-2.9, -5.0]])), dtype="float32")
    assert IR.trigger(inside, "", "crash:ZeroDivisionError") is None  # one weight is not 0: not this cause
    assert IR.trigger(icepop, "", "wrong value") is None

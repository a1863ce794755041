"""rollout_rejection_mask: the reference's decisions at the bounds, its diagnostics on legal
inputs where every weight is tiny, the family's yardstick, and the real-engine findings pinned on small
inputs (verl 0.9.1, SkyRL 0.4.0)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import rlconform.reference as R
from rlconform.harness.bindings.reference import binding as reference_binding
from rlconform.harness.families import rejection_mask as RS
from rlconform.harness.mutants import rs_ratio_bounds_inverted
from rlconform.properties import generic as G
from rlconform.properties.case import Case


def _mask(lp, old, m, *options):
    return R.rollout_rejection_mask(np.array(lp, float), np.array(old, float), np.array(m, bool), options)


def test_bounds_are_inclusive_and_on_the_ratio():
    lo, hi = math.log(0.8), math.log(1.5)
    kept = _mask([[lo, hi, lo - 1e-3, hi + 1e-3]], [[0.0] * 4], [[1] * 4], ("token", "k1", 0.8, 1.5))
    assert kept.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    # the inverse reading (bounds on π_rollout/π_train) keeps r = 0.7 and rejects r = 1.4: the reference does not
    assert _mask([[math.log(0.7), math.log(1.4)]], [[0.0, 0.0]], [[1, 1]], ("token", "k1", 0.8, 1.5)).tolist() == [[0.0, 1.0]]


def test_sequence_sum_is_exact_beyond_the_clamp():
    # +25 and −20.5: Σ = 4.5 (ratio e^4.5 ≈ 90 > 5): rejected; clamping each token first would give 0 (kept)
    kept = _mask([[-0.5, -30.0]], [[-25.5, -9.5]], [[1, 1]], ("seq_sum", "k1", 0.2, 5.0))
    assert kept.tolist() == [[0.0, 0.0]]


def test_masked_garbage_and_empty_rows():
    lp = np.array([[np.nan, -1.0], [np.inf, -np.inf]])
    old = np.array([[np.inf, -1.0], [1e30, np.nan]])
    m = np.array([[0, 1], [0, 0]], bool)
    for level in ("token", "seq_sum", "seq_mean", "seq_max", "seq_all"):
        est = "k2" if level == "seq_max" else "k1"
        kept = R.rollout_rejection_mask(lp, old, m, ((level, est, 0.5 if est == "k1" else None, 2.0),))
        assert kept.tolist() == [[0.0, 1.0], [0.0, 0.0]], level
    metrics = R.rollout_correction_metrics(lp, old, m, R.rollout_rejection_mask(lp, old, m, (("token", "k1", 0.5, 2.0),)))
    assert metrics["rs_seq_masked_fraction"] == 0.0 and metrics["training_ppl"] == pytest.approx(math.e)
    assert all(math.isfinite(v) for v in metrics.values())


def test_every_weight_tiny_metrics_are_finite_and_ess_is_one():
    d = np.full((3, 4), -25.0)  # every weight clamped to e^-20 ≈ 2e-9: equal weights
    old = np.full((3, 4), -1.0)
    m = np.ones((3, 4), bool)
    metrics = R.rollout_correction_metrics(old + d, old, m, np.zeros((3, 4)))
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["is_ess"] == pytest.approx(1.0, rel=1e-12)
    assert metrics["is_fraction_low"] == 1.0 and metrics["rs_masked_fraction"] == 1.0


def test_boundary_band_accepts_either_decision_only_at_the_bound():
    hi = math.log(2.0)
    lp = np.array([[hi, hi + 1e-3, 0.1]])
    keep, decided = RS.decided("token_k1", lp, np.zeros_like(lp), np.ones_like(lp, bool), "float32")
    assert decided.tolist() == [[False, True, True]] and keep[0, 1:].tolist() == [0.0, 1.0]


def _case(variant, lp, old, mask, prop="matches_reference", dtype="float64"):
    x = {"log_prob": np.array(lp, float), "old_log_prob": np.array(old, float), "mask": np.array(mask, bool),
         "garbage": float("nan"), "variant": variant}
    return Case("rollout_rejection_mask", prop, dtype, f"{variant}@moderate", x)


def test_reference_engine_passes_and_the_inverted_bounds_mutant_fails():
    case = _case("token_k1_asym", [[math.log(0.55), math.log(1.8), -1.0]], [[0.0, 0.0, -1.0]], [[1, 1, 1]])
    assert G.matches_reference(RS.evaluate(reference_binding, case)).ok
    out = G.matches_reference(RS.evaluate(rs_ratio_bounds_inverted.binding, case))
    assert not out.ok and "kept mask" in out.message


# ------------------------------------------------------------- engine findings pinned on small inputs
@pytest.mark.engines
def test_verl_binds_every_rejection_option():
    from verl.trainer.ppo import rollout_corr_helper as rc

    from rlconform.harness.bindings import verl

    rs = verl.binding.resolve("rollout_rejection_mask")
    bound = {opt for spec, _ in verl.ROLLOUT_RS.values() for opt in spec.split(",")}
    assert set(rc.SUPPORTED_ROLLOUT_RS_OPTIONS) <= bound
    assert set(rs.impls) | set(rs.unchecked) >= set(RS.VARIANTS)


@pytest.mark.engines
def test_verl_findings():
    """verl 0.9.1: k1 bounds on 1 / r; per-token clamp before the sequence sum; ESS with + 1e-8; the rejected
    row fraction over every row."""
    from rlconform.harness.bindings import verl

    rs = verl.binding.resolve("rollout_rejection_mask")
    t = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    kept, _ = rs.get("x", "token_k1_asym")(t([[math.log(0.55), math.log(1.8)]]), t([[0.0, 0.0]]),
                                           torch.ones(1, 2, dtype=torch.bool))
    assert kept.tolist() == [[0.0, 1.0]]  # the reference: [[1, 0]] (bounds [0.5, 1.5] read on 1 / r)
    kept, _ = rs.get("x", "seq_sum_k1")(t([[-0.5, -30.0]]), t([[-25.5, -9.5]]), torch.ones(1, 2, dtype=torch.bool))
    assert kept.tolist() == [[1.0, 1.0]]  # Σ = 4.5: the reference rejects the row
    _, metrics = rs.get("x", "token_k1")(t([[-26.0, -26.0], [-1.0, -1.0]]), t([[-1.0, -1.0], [-1.0, -1.0]]),
                                         torch.tensor([[1, 1], [0, 0]], dtype=torch.bool))
    assert metrics["is_ess"] > 30  # equal weights e^-20: the reference's ESS is 1
    assert metrics["rs_seq_masked_fraction"] == 0.5  # 1 of 1 non-empty row rejected: the reference says 1.0


@pytest.mark.engines
def test_skyrl_findings():
    """SkyRL 0.4.0: NaN at a masked position keeps a sequence row the reference rejects; the rejected row
    fraction over every row."""
    from rlconform.harness.bindings import skyrl

    rs = skyrl.binding.resolve("rollout_rejection_mask")
    assert set(rs.impls) == set(skyrl.SKYRL_RS)
    t = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    m = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    lp, old = t([[-0.1, -0.1, float("nan")], [-1.0, -1.0, -1.0]]), t([[-3.0, -3.0, -1.0], [-1.0, -1.0, -1.0]])
    kept, metrics = rs.get("x", "seq_sum_k1")(lp, old, m)
    assert kept.sum().item() == 2  # Σ = 5.8 (ratio 330 > 5): the reference rejects the row
    clean, metrics = rs.get("x", "seq_sum_k1")(torch.where(m, lp, -1.0), old, m)
    assert clean.sum().item() == 0 and metrics["rs_seq_masked_fraction"] == 0.5  # the reference: 1.0


def test_a_deciding_ratio_near_a_bound_is_said_to_be_near_it():
    """A row showing r = 0.7998 against a bound of 0.8 reads like a rounding tie: the trigger says "near a bound";
    a deciding ratio 10 % or more from every bound (the declared ones and their inverses) is shown plainly."""
    from rlconform.harness.families.rejection_mask import _near_bound

    bounds = (0.5, 1.5, 1 / 1.5, 2.0)  # "0.5_1.5" and the inverse ratio's bounds
    assert _near_bound(np.array([0.7998]), (0.8, 1.5, 1 / 1.5, 1.25)) == ", near a bound: r = 0.7998 vs 0.8"
    assert _near_bound(np.array([1.75]), bounds) == ""  # 17 % from 1.5, 12 % from 2
    assert _near_bound(np.array([1.95, 1.75]), bounds) == ""  # one deciding token far from every bound is enough
    assert _near_bound(np.array([1.95]), bounds) == ", near a bound: r = 1.95 vs 2"


def test_an_unplaced_token_example_keeps_every_ratio_clear_of_the_bounds():
    """The example shrinking prefers (no token placed on a bound) holds no token ratio within 10 % of a token k1
    bound or its inverse, so the asymmetric-bounds row shows a flip a maintainer reads as one (r = 1.75 kept
    against [0.5, 1.5]), not a rounding tie."""
    from rlconform.harness.families.rejection_mask import NEAR_BOUND, _clear_of_bounds

    bounds = np.array([0.5, 1.5, 2.0, 1 / 1.5])
    delta = np.log(np.concatenate([bounds * 0.97, bounds * 1.04, [1.75, 0.58, 1.0]]))
    out = np.exp(_clear_of_bounds(delta, "token_k1_asym"))
    assert (np.min(np.abs(out[:, None] / bounds - 1), axis=1) >= NEAR_BOUND).all(), out
    np.testing.assert_allclose(out[-3:], [1.75, 0.58, 1.0])  # already clear: unchanged
    assert (_clear_of_bounds(delta, "seq_mean_k3") == delta).all()  # no token k1 bound: nothing moves


def test_a_flip_of_a_ratio_on_a_bound_is_named_as_rounding_not_as_inverted_bounds():
    """SkyRL's float64 token mask keeps r = 1.5 · (1 + 1e-9) (its exp runs in float32): the flip is the ratio's
    last bits on the bound, not bounds read on 1 / r."""
    from rlconform.harness.families.rejection_mask import _mask_trigger

    x = {"variant": "token_k1_asym"}
    m = np.array([[True]])
    tie = _mask_trigger(x, m, np.array([[math.log(1.5) + 1e-9]]))
    assert tie.startswith("a ratio on a bound (r = 1.5") and "rounding" in tie
    flip = _mask_trigger(x, m, np.array([[math.log(1.75)]]))
    assert flip.startswith("asymmetric k1 bounds")

"""Regressions of rlconform's own mistakes found in verl 0.9.1's report: each test fails on
the harness as it was before the fix."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from rlconform.harness.bindings.load import load_engine
from rlconform.harness.catalog.binding import Binding, LossVariants
from rlconform.harness.families import policy_loss as PL
from rlconform.harness.run.dispatch import run_check
from rlconform.properties.case import Case

HAS_VERL = importlib.util.find_spec("verl") is not None
verl_only = pytest.mark.skipif(not HAS_VERL, reason="verl not installed")


# ------------------------------------------------------------------------------ SAPO's aggregation
def _sapo_case(prop="matches_reference"):
    """Two full rows of different lengths (1 and 4 valid tokens, no empty row): token-mean and
    seq-mean-token-mean differ, and the all-rows / non-empty-rows denominators agree."""
    rng = np.random.default_rng(3)
    mask = np.array([[True, False, False, False], [True, True, True, True]])
    old = rng.uniform(-2, -0.5, mask.shape)
    lp = old + rng.uniform(-0.3, 0.3, mask.shape)
    adv = np.repeat(np.array([[1.5], [-0.5]]), 4, axis=1)
    return Case("policy_loss", prop, "float64", "sapo@moderate",
                {"old_log_prob": old, "log_prob": lp, "advantages": adv, "mask": mask,
                 "partitions": [[[0, 2]], [[0, 1], [1, 2]]], "garbage": float("nan"), "variant": "sapo"})


def _reference_sapo(agg_modes):
    ref = PL.reference_variants()
    return Binding("declares", ops={"policy_loss": LossVariants(
        {"sapo": ref.impls["sapo"]}, combine_metrics=ref.combine_metrics, agg_modes=agg_modes)})


def test_sapo_reference_follows_the_declared_aggregation():
    """The reference aggregates SAPO as the binding declares; an engine that does not follow its declared
    convention fails (here: a token-mean SAPO declared as seq-mean-token-mean)."""
    case = _sapo_case()
    assert PL.agg_mode(LossVariants({}), "sapo") == "token-mean"
    assert run_check(_reference_sapo({}), case).ok
    stopped = run_check(_reference_sapo({"sapo": "seq-mean-token-mean"}), case)
    assert not stopped.ok and "loss" in stopped.message


@pytest.mark.engines
@verl_only
def test_verl_sapo_is_compared_with_seq_mean_token_mean():
    """verl's compute_policy_loss_sapo forces seq-mean-token-mean (core_algos.py:1688); compared with
    token-mean it failed every case with rows of different lengths."""
    verl = load_engine("verl")
    assert verl.resolve("policy_loss").agg_modes == {"sapo": "seq-mean-token-mean"}
    out = run_check(verl, _sapo_case())
    assert out.ok, out.message


# ------------------------------------------------------------------- optimal_token_baseline's inputs
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st

from rlconform.harness.families import optimal_token_baseline as OTB  # noqa: E402


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.sampled_from(["float32", "float64"]).flatmap(lambda dt: st.tuples(st.just(dt), OTB.inputs(dt))))
def test_otb_draws_sum_pi_squared_some_distribution_has(drawn):
    """Regression: π and Σπ² were drawn and rounded independently, giving w = 1 − 2π + Σπ² = −2.1e-8, which no
    distribution allows; the finding then showed a 45× error. Every drawn position must satisfy
    π² ≤ Σπ² ≤ π² + (1 − π)² with π = exp(old_log_probs) as the engine reads it, in the drawn dtype."""
    dtype, case = drawn
    pi = np.exp(case["old_log_probs"])
    spp = case["sum_pi_squared"]
    assert np.all(case["old_log_probs"] <= 0)
    assert np.all(spp >= pi**2), np.min(spp - pi**2)
    assert np.all(spp <= pi**2 + (1 - pi) ** 2), np.max(spp - pi**2 - (1 - pi) ** 2)
    assert np.all(1 - 2 * pi + spp >= 0)
    assert np.array_equal(OTB.S.round_to(spp, dtype), spp) and np.array_equal(OTB.S.round_to(case["old_log_probs"], dtype), case["old_log_probs"])


def test_consistent_spp_moves_a_rounded_sum_into_the_interval():
    lp = np.array([np.log(0.5), 0.0, float(np.float32(-1e-5))])
    spp = np.array([0.2, 1.0, 1.0])  # 0.2 < 0.5²; one-hot fine; π = 1 − 1e-5 and Σπ² = 1 > π² + (1 − π)²
    lp2, spp2 = OTB.consistent_spp(lp, spp, "float32")
    pi = np.exp(lp2)
    assert np.all((spp2 >= pi**2) & (spp2 <= pi**2 + (1 - pi) ** 2))
    assert lp2[1] == 0.0 and spp2[1] == 1.0


# --------------------------------------------------------- mask_invariant keeps the clean problem
from rlconform.harness.core.garbage import with_masked_column  # noqa: E402
from rlconform.harness.families import advantages as ADV  # noqa: E402


def test_with_masked_column_pads_instead_of_clearing_a_valid_token():
    arrs = {"r": np.array([[0.0, 1.0], [0.0, -1.0]]), "m": np.ones((2, 2), bool), "index": np.array([0, 0])}
    out = with_masked_column(arrs, "m", ("r", "absent"), fill={"r": 0.0})
    assert out["m"].tolist() == [[True, True, False], [True, True, False]]
    assert out["r"].tolist() == [[0.0, 1.0, 0.0], [0.0, -1.0, 0.0]] and out["index"] is arrs["index"]
    partial = {"r": arrs["r"], "m": np.array([[True, False], [True, True]])}
    assert with_masked_column(partial, "m", ("r",))["m"] is partial["m"]
    with pytest.raises(ValueError, match="time dim"):
        with_masked_column({"r": np.zeros((2, 3)), "m": np.ones((2, 2), bool)}, "m", ("r",))


def _clean_values_match(ev):
    for c in ev.values:
        keep = np.ones(np.shape(c.reference), bool) if c.only_where is None else c.only_where
        assert np.allclose(c.engine[keep], c.reference[keep], rtol=1e-6, atol=1e-9), (c.label, c.engine, c.reference)


@pytest.mark.engines
@verl_only
@pytest.mark.parametrize("estimator,rewards", [
    ("grpo", [[0.0, 1.0], [0.0, 0.5], [0.0, -1.0]]),
    ("grpo_passk", [[0.95], [0.9499999]]),  # the committed case (T = 1: the cleared bit emptied the row)
])
def test_outcome_advantage_mask_invariant_keeps_the_outcome_reward_valid(estimator, rewards):
    """Regression (verl 0.9.1 report, ``grpo_passk@near_constant``): an all-valid mask had its last bit cleared,
    so the last row's outcome reward (on its last token) sat at a masked position; verl, whose callers keep
    rewards zero outside the mask, summed it and the card showed −1.0 vs −0.5 in a check about garbage. The
    clean part of the check must now be the unchanged problem (verl matches it)."""
    case = Case("outcome_advantage", "mask_invariant", "float64", f"{estimator}@near_constant",
                {"token_level_rewards": np.array(rewards), "response_mask": np.ones(np.shape(rewards), bool),
                 "index": np.zeros(len(rewards), np.int64), "garbage": 0.0})
    ev = ADV.evaluate(load_engine("verl"), case)
    assert ev.values
    _clean_values_match(ev)
    assert ev.values[0].only_where.shape[1] == len(rewards[0]) + 1  # a padding column took the garbage


# ---------------------------------------------------------------- the resolution floor of a tolerance
from rlconform.harness.core import tolerance as TOL  # noqa: E402
from rlconform.harness.families import metric_statistics as MS  # noqa: E402
from rlconform.harness.families import reductions as RED  # noqa: E402


def test_a_bound_is_never_finer_than_half_an_ulp_of_the_resolution_dtype():
    """Regression: fp16 masked_var at 16 625 was held to 7.05 (float32 output, fp16 sums; half an fp16 ulp
    there is 8), metric_statistics len_mean to 1e-9 though verl computes it in float32."""
    ref = 16625.0
    assert TOL.resolution_floor(ref, "float32", "float16")[0] == 8.0
    assert not TOL.compare(ref + 7.9, ref, ref, dtype="float32", kind="reduction").ok  # the old bound
    assert TOL.compare(ref + 7.9, ref, ref, dtype="float32", kind="reduction", resolution="float16").ok
    assert not TOL.compare(ref + 8.5, ref, ref, dtype="float32", kind="reduction", resolution="float16").ok
    assert TOL.bound(ref, ref, dtype="float32", kind="reduction", resolution="float16")[0] == 8.0
    third = 1 / 3
    got = float(np.float32(third))  # verl's float32 mean length 0.3333333432674408
    assert not TOL.compare(got, third, None, dtype="float64", kind="pipeline").ok
    assert TOL.compare(got, third, None, dtype="float64", kind="pipeline", resolution="float32").ok
    assert TOL.coarser("float32", "float64") == "float32" and TOL.coarser("float64", None) == "float64"


def test_families_name_the_resolution_of_values_computed_narrower_than_returned():
    ref = load_engine("reference")
    mk = lambda op: Case(op, "matches_reference", "float16", "random",  # noqa: E731
                         {"values": np.array([[637.0, 269.75, 3.5]]), "mask": np.ones((1, 3), bool),
                          "unbiased": False, "garbage": 0.0})
    assert RED.evaluate(ref, mk("masked_var")).values[0].resolution == "float16"
    assert RED.evaluate(ref, mk("masked_count")).values[0].resolution is None  # a count stays exact
    assert MS.RESOLUTION == {"len_mean": "float32"} and not set(MS.RESOLUTION) & set(MS.R.INTEGER_STATISTICS)

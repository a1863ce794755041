"""Regressions of rlconform's own mistakes found in verl 0.9.1's report (issue 20 §4): each test fails on
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


@verl_only
def test_verl_sapo_is_compared_with_seq_mean_token_mean():
    """verl's compute_policy_loss_sapo forces seq-mean-token-mean (core_algos.py:1688); compared with
    token-mean it failed every case with rows of different lengths."""
    verl = load_engine("verl")
    assert verl.resolve("policy_loss").agg_modes == {"sapo": "seq-mean-token-mean"}
    out = run_check(verl, _sapo_case())
    assert out.ok, out.message


# ------------------------------------------------------------------- optimal_token_baseline's inputs
from hypothesis import given, settings, HealthCheck, strategies as st  # noqa: E402

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

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

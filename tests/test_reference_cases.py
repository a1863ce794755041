"""The right values of the docs/bug-kinds.md rows, hand-checked small cases per mode, edges and errors.

Each bug-kind row that a reference function decides gets its right value asserted exactly (or to the
digits the row gives); the faulty value of the row must differ. Property-based checks against mpmath
and exact rationals are in test_reference_mpmath.py.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

import rlconform.reference as R

EPS = 2.0**-53
NINF = float("-inf")


# --------------------------------------------------------------------------------------------------
# token statistics: rows 9 and 11, errors


def test_cases_md_row_9_and_11_exact_values():
    # row 9: fp32 logits [2, 0] -> entropy 0.3653 (check digits against mpmath)
    x = np.array([2.0, 0.0], dtype=np.float32)
    h = float(R.entropy(x))
    assert round(h, 4) == 0.3653
    with mpmath.workdps(50):  # H = log(1 + e^-2) + 2 e^-2 / (1 + e^-2)
        ref = mpmath.log1p(mpmath.exp(-2)) + 2 * mpmath.exp(-2) / (1 + mpmath.exp(-2))
        assert abs(mpmath.mpf(h) - ref) <= 2 * EPS * h
    assert round(float(ref), 6) == 0.365334
    # row 11: masked vocab and fp16 extremes
    assert float(R.entropy(np.array([0.0, NINF]))) == 0.0
    assert abs(float(R.entropy(np.array([0.0, 0.0, NINF]))) - math.log(2)) <= math.ulp(math.log(2))
    assert round(float(R.entropy(np.array([0.0, 0.0, NINF]))), 6) == 0.693147
    assert float(R.entropy(np.array([65504, -65504], dtype=np.float16))) == 0.0
    for xx in (np.array([0.0, NINF]), np.array([0.0, 0.0, NINF]), np.array([65504, -65504], dtype=np.float16)):
        for fn in (R.logsumexp_grad, R.entropy_grad, R.sum_pi_squared_grad):
            assert np.isfinite(fn(xx)).all()
        assert np.isfinite(R.token_logprobs_grad(xx, np.int64(0))).all()
    np.testing.assert_array_equal(R.entropy_grad(np.array([0.0, NINF])), [0.0, 0.0])
    # a label on a masked entry: log-prob -inf, gradient e_y - p
    assert float(R.token_logprobs(np.array([0.0, NINF]), np.int64(1))) == NINF
    np.testing.assert_array_equal(R.token_logprobs_grad(np.array([0.0, NINF]), np.int64(1)), [-1.0, 1.0])

@pytest.mark.parametrize(
    "x, match",
    [
        (np.array([[0.0, 1.0], [NINF, NINF]]), r"row \(1,\).*all -inf"),
        (np.array([[[0.0, 1.0]], [[NINF, NINF]]]), r"row \(1, 0\).*all -inf"),
        (np.array([0.0, np.nan]), "NaN"),
        (np.array([[1.0, 2.0], [np.inf, 0.0]]), r"\+inf in row \(1,\)"),
        (np.array([[np.nan, np.inf]]), "NaN"),
        (np.zeros((2, 0)), "empty vocab"),
        (np.float64(1.0), "at least one dimension"),
    ],
)
def test_bad_logits_raise(x, match):
    for fn in (R.logsumexp, R.entropy, R.sum_pi_squared, R.logsumexp_grad, R.entropy_grad, R.sum_pi_squared_grad):
        with pytest.raises(ValueError, match=match):
            fn(x)


def test_bad_labels_raise():
    x = np.zeros((2, 3))
    for lab, match in ((np.array([0, 3]), "out of range"), (np.array([-1, 0]), "out of range"),
                       (np.array([0, 1, 2]), "shape"), (np.array([0.0, 1.0]), "integer")):
        with pytest.raises(ValueError, match=match):
            R.token_logprobs(x, lab)
        with pytest.raises(ValueError, match=match):
            R.token_logprobs_grad(x, lab)
    with pytest.raises(ValueError, match="grad_output"):
        R.entropy_grad(x, np.ones(3))
    with pytest.raises(TypeError):
        R.entropy(np.array(["a", "b"]))


# --------------------------------------------------------------------------------------------------
# reductions: cancellation, edges, errors


def test_reductions_catastrophic_cancellation_and_edges():
    v = np.array([[1e16, 1.0, -1e16]])
    m = np.ones_like(v, dtype=bool)
    assert R.masked_sum(v, m) == 1.0
    assert R.masked_mean(v, m) == 1.0 / 3.0
    exact = sum((Fraction(x) - Fraction(1, 3)) ** 2 for x in (1e16, 1.0, -1e16))
    assert R.masked_var(v, m, unbiased=False) == pytest.approx(float(exact / 3), rel=4 * EPS)
    assert R.masked_var(v, m, unbiased=True) == pytest.approx(float(exact / 2), rel=4 * EPS)
    # mean not representable: 1e16 + 1; naive two-pass gives 2 or 0, the corrected one gives 1
    w = np.array([[1e16, 1e16 + 2]])
    assert R.masked_var(w, np.ones((1, 2), bool), unbiased=False) == 1.0
    # masked NaN ignored, unmasked NaN raises, masks must be 0/1 and of the right shape
    assert R.masked_mean(np.array([[1.0, np.nan]]), np.array([[1, 0]])) == 1.0
    with pytest.raises(ValueError, match="non-finite"):
        R.masked_mean(np.array([[1.0, np.nan]]), np.array([[1, 1]]))
    with pytest.raises(ValueError, match="0/1"):
        R.masked_sum(np.ones((1, 2)), np.array([[0.5, 1.0]]))
    with pytest.raises(ValueError, match="shape"):
        R.masked_sum(np.ones((1, 2)), np.ones((2, 1)))
    assert math.isnan(R.moments_to_mean_var(R.Moments(0, 0.0, 0.0))[0])
    assert math.isnan(R.moments_to_mean_var(R.Moments(1, 2.0, 4.0), unbiased=True)[1])
    assert R.chan_merge((0, 0.0, 0.0), (3, 2.0, 1.0)) == (3, 2.0, 1.0)
    assert R.merge_moments([]) == R.Moments(0, 0.0, 0.0)


# --------------------------------------------------------------------------------------------------
# metrics and agg_loss: the metric and loss rows, each mode by hand


def _shards_global(shards):
    """Right-pad shards [(values list)] into one [B, T] global batch with a mask."""
    t = max(len(s) for s in shards)
    v = np.zeros((len(shards), t))
    m = np.zeros((len(shards), t), bool)
    for i, s in enumerate(shards):
        v[i, : len(s)] = s
        m[i, : len(s)] = True
    return v, m


def test_cases_md_metric_rows():
    # row 1 / 2: shard A 1 token entropy 1.0, shard B 100 tokens entropy 2.0 -> 201/101
    v, m = _shards_global([[1.0], [2.0] * 100])
    tm = R.token_metrics(v, m)
    assert tm["mean"] == 201 / 101 and round(tm["mean"], 6) == 1.990099
    assert tm["mean"] != (1.0 + 2.0) / 2  # the faulty mean of per-shard means
    assert tm["nnz"] == 101 and tm["min"] == 1.0 and tm["max"] == 2.0
    assert tm["std"] == pytest.approx(math.sqrt(100) / 101, rel=4 * EPS)  # population: sqrt(p(1-p)), p = 1/101
    assert set(tm) == {"mean", "std", "min", "max", "nnz"}
    # row 6: clip fraction, rank 0: 3 of 12 tokens clipped, rank 1: 3 of 4 -> 6/16
    v, m = _shards_global([[1.0] * 3 + [0.0] * 9, [1.0] * 3 + [0.0]])
    assert R.token_metrics(v, m)["mean"] == 0.375 != (3 / 12 + 3 / 4) / 2
    # row 8: 4 micro-batches of loss 1.0 -> 1.0
    v, m = _shards_global([[1.0] * 3] * 4)
    assert R.token_metrics(v, m)["mean"] == 1.0
    empty = R.token_metrics(np.zeros((2, 3)), np.zeros((2, 3), bool))
    assert empty["nnz"] == 0 and all(math.isnan(empty[k]) for k in ("mean", "std", "min", "max"))


def test_cases_md_agg_loss_rows():
    # row 3: micro A 1 token loss 1.0, micro B 3 tokens loss 2.0 -> 7/4
    v, m = _shards_global([[1.0], [2.0] * 3])
    assert R.agg_loss(v, m, "token-mean") == 1.75 != (1.0 + 2.0) / 2
    # row 4: 1 token at 1.0, 100 tokens at 2.0 -> 201/101
    v, m = _shards_global([[1.0], [2.0] * 100])
    assert R.agg_loss(v, m, "token-mean") == 201 / 101 != 1.0 / 1 + 200.0 / 100
    # row 5: one sequence, 8 tokens of loss 1.0 (CP split is the engine's business) -> 1.0
    v, m = _shards_global([[1.0] * 8])
    for mode in ("token-mean", "seq-mean-token-mean"):
        assert R.agg_loss(v, m, mode) == 1.0
    # row 7: 4 micro-batches, one fully masked, the others mean loss 1.0 -> 1.0
    v = np.ones((4, 3))
    m = np.ones((4, 3), bool)
    m[2] = False
    for mode in ("token-mean", "seq-mean-token-mean"):
        assert R.agg_loss(v, m, mode) == 1.0


def test_agg_loss_each_mode_hand_checked():
    loss = np.array([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [5.0, 6.0, 9.0, 9.0]])
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    expected = {
        "token-mean": 10 / 4,
        "token-sum": 10.0,
        "seq-mean-token-sum": (6 + 4) / 2,
        "seq-mean-token-mean": (2 + 4) / 2,
        "seq-mean-token-sum-norm": (6 + 4) / 2 / 4,  # T = 4
    }
    assert set(expected) == set(R.LOSS_AGG_MODES)
    for mode, val in expected.items():
        assert R.agg_loss(loss, mask, mode) == val, mode
    assert R.agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=10) == 0.5
    assert R.agg_loss(loss, mask, "token-mean", loss_scale_factor=10) == 2.5  # ignored outside -norm
    none = np.zeros_like(mask)
    for mode in R.LOSS_AGG_MODES:
        got = R.agg_loss(loss, none, mode)
        assert got == 0.0 if mode == "token-sum" else math.isnan(got), mode
    with pytest.raises(ValueError) as exc:
        R.agg_loss(loss, mask, "seq-mean")
    assert all(mode in str(exc.value) for mode in R.LOSS_AGG_MODES)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        R.agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=0)
    with pytest.raises(ValueError, match="non-finite"):
        R.agg_loss(np.where(mask, np.nan, 0.0), mask, "token-mean")


# --------------------------------------------------------------------------------------------------
# optimal token baseline (verl PR #6153)


def test_optimal_token_baseline_hand_checked():
    # π = 0.5, Σπ² = 0.5 -> w = 0.5 everywhere; group of 3 with lengths 4, 2, 3
    r = np.zeros((3, 4))
    r[0, 3] = 1.0
    r[1, 1] = 0.5
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    lp = np.full((3, 4), math.log(0.5))
    s2 = np.full((3, 4), 0.5)
    adv, ret = R.optimal_token_baseline(r, mask, ["u", "u", "u"], lp, s2)
    np.testing.assert_array_equal(ret, [[1, 1, 1, 1], [0.5, 0.5, 0, 0], [0, 0, 0, 0]])
    # t=0: (1·.5 + .5·.5 + 0)/1.5 = .5; t=2: (1·1.5 + 0)/3 = .5; t=3: the unique longest -> baseline 0
    np.testing.assert_array_equal(adv, [[0.5, 0.5, 0.5, 1.0], [0.0, 0.0, 0.0, 0.0], [-0.5, -0.5, -0.5, 0.0]])
    adv2, _ = R.optimal_token_baseline(r, mask, ["u", "u", "u"], lp, s2, handle_zero_tail=False)
    assert adv2[0, 3] == 1.0 - 1.0  # only member left at t=3: baseline = its own return
    # singletons: advantage = return; a zero denominator (π = 1, Σπ² = 1 -> w = 0) gives baseline 0
    adv3, ret3 = R.optimal_token_baseline(r, mask, [0, 1, 2], lp, s2)
    np.testing.assert_array_equal(adv3, np.where(mask, ret3, 0.0))
    adv4, ret4 = R.optimal_token_baseline(r, mask, [7, 7, 7], np.zeros((3, 4)), np.ones((3, 4)))
    np.testing.assert_array_equal(adv4, np.where(mask, ret4, 0.0))
    with pytest.raises(ValueError, match="index"):
        R.optimal_token_baseline(r, mask, [0, 1], lp, s2)
    with pytest.raises(ValueError, match="non-finite"):
        R.optimal_token_baseline(np.where(mask, np.nan, 0.0), mask, [0, 0, 0], lp, s2)


# --------------------------------------------------------------------------------------------------
# inputs are never modified


def test_reference_never_modifies_inputs():
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((3, 5)).astype(np.float32)
    logits[0, 1] = NINF
    labels = np.array([0, 4, 2])
    vals = rng.standard_normal((3, 5))
    vals[1, 1] = np.nan  # masked garbage
    mask = np.ones((3, 5), bool)
    mask[1, 1] = False
    lp = -np.abs(vals)
    s2 = np.full((3, 5), 0.7)
    copies = [a.copy() for a in (logits, labels, vals, mask, lp, s2)]
    for fn in (R.logsumexp, R.entropy, R.sum_pi_squared, R.logsumexp_grad, R.entropy_grad, R.sum_pi_squared_grad):
        fn(logits)
    R.token_logprobs(logits, labels)
    R.token_logprobs_grad(logits, labels, np.ones(3))
    R.token_metrics(vals, mask)
    R.moments(vals, mask)
    for mode in R.LOSS_AGG_MODES:
        R.agg_loss(vals, mask, mode)
    R.optimal_token_baseline(np.where(mask, vals, 0.0), mask, [0, 0, 1], lp, s2, np.full((3, 5), 0.9))
    for a, c in zip((logits, labels, vals, mask, lp, s2), copies):
        np.testing.assert_array_equal(a, c)

"""Rollout-correction rejection masks and their diagnostics.

With Δ_{i,t} = log_prob − old_log_prob at the valid tokens of row i (``log_prob``: the training policy,
``old_log_prob``: the rollout policy, so r = e^Δ = π_train / π_rollout) and the per-token statistics

===========  ==========================  ==========================================================
estimator    per-token statistic s(Δ)     bounds (inclusive)
===========  ==========================  ==========================================================
``k1``       Δ = log r                    lower ≤ r ≤ upper, i.e. log lower ≤ statistic ≤ log upper
``k2``       ½ Δ²                         statistic ≤ upper
``k3``       e^Δ − 1 − Δ                  statistic ≤ upper
===========  ==========================  ==========================================================

an option ``(level, estimator, lower, upper)`` keeps a valid token when its statistic is inside the bounds:

=============  ============================================================================================
level          statistic compared with the bounds
=============  ============================================================================================
``token``      s(Δ_{i,t}) of the token itself (verl ``token_k*``; SkyRL ``compute_token_mask``)
``seq_sum``    Σ_t s(Δ_{i,t}) over the row's valid tokens, for every token of the row (k1: the sequence
               ratio ∏ r, verl ``seq_sum_k*``; SkyRL ``sequence_mask_metric="product"``)
``seq_mean``   the row's mean (k1: the geometric-mean ratio, verl ``seq_mean_k*``; SkyRL ``"geometric"``)
``seq_max``    the row's max (k2, k3: verl ``seq_max_k*``)
``seq_all``    the row is kept when every valid token is inside the bounds (SkyRL
               ``compute_outlier_token_mask``)
=============  ============================================================================================

Several options are chained by AND (verl ``rollout_rs="token_k1,seq_mean_k3"``). The mask is 1 at the
kept valid tokens and 0 elsewhere (masked positions, whatever the inputs hold there, are 0).

The decision is taken on the exact log-ratios: no ±20 clamp (the engines clamp before ``exp`` for
stability; a clamp at ±20 never moves a token statistic across a bound below e^20, but clamping each
token *before* a sequence sum does: tokens at +25 and −24 give Σ = 1, a ratio of e, not 20 − 20 = 0).
Source: verl 0.9.1 ``trainer/ppo/rollout_corr_helper.compute_rollout_rejection_mask`` (its ``*_k1``
bounds are documented as ratio bounds, ``RolloutCorrectionConfig.rollout_rs_threshold``); SkyRL 0.4.0
``off_policy_correction_utils.compute_token_mask`` / ``compute_sequence_mask`` / ``compute_outlier_token_mask``.

Diagnostics (:func:`rollout_correction_metrics`, verl ``compute_rs_metrics`` / ``compute_is_metrics`` /
``compute_offpolicy_metrics``): plain Python floats, defined on every input with a valid token.
"""

from __future__ import annotations

import math

import numpy as np

from .exact_sum import exact_sum

__all__ = ["RS_LEVELS", "RS_ESTIMATORS", "rollout_rejection_mask", "rejection_statistics",
           "rollout_correction_metrics"]

RS_LEVELS = ("token", "seq_sum", "seq_mean", "seq_max", "seq_all")
RS_ESTIMATORS = ("k1", "k2", "k3")
#: the engines' clamp of the log-ratio before exp (IS weights, χ²)
SAFETY_BOUND = 20.0


def _delta(log_prob, old_log_prob, mask):
    m = np.asarray(mask, bool)
    lp = np.where(m, np.asarray(log_prob, np.float64), 0.0)
    old = np.where(m, np.asarray(old_log_prob, np.float64), 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.where(m, lp - old, 0.0)
    return m, lp, old, d


def _token_stat(d, estimator):
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        with np.errstate(over="ignore"):
            return np.expm1(d) - d
    raise ValueError(f"unknown estimator {estimator!r}; expected one of {RS_ESTIMATORS}")


def _bounds(estimator, lower, upper):
    """The bounds in the statistic's units: (lo or None, hi)."""
    if not (upper > 0):
        raise ValueError(f"upper bound must be > 0, got {upper!r}")
    if estimator == "k1":
        if lower is None or not (0 < lower <= upper):
            raise ValueError(f"k1 bounds need 0 < lower <= upper, got {lower!r}, {upper!r}")
        return math.log(lower), math.log(upper)
    return None, float(upper)


def rejection_statistics(log_prob, old_log_prob, response_mask, level, estimator):
    """(statistic [B, T] broadcast over each row for the sequence levels, scale [B, T] ≥ 0): the value each
    valid token's decision compares with the bounds, and the magnitude its computation adds up (Σ of the
    terms' absolute values, in the statistic's units per unit relative rounding: |log_prob| + |old_log_prob|
    + 1 per token, times |ds/dΔ|, plus |s|), from which a caller bounds what a correct fp32 computation can
    differ by. ``seq_all`` returns the token statistic (its decision is per token, then per row)."""
    if level not in RS_LEVELS:
        raise ValueError(f"unknown level {level!r}; expected one of {RS_LEVELS}")
    m, lp, old, d = _delta(log_prob, old_log_prob, response_mask)
    s = np.where(m, _token_stat(d, estimator), 0.0)
    grad = {"k1": np.ones_like(d), "k2": np.abs(d), "k3": np.abs(np.expm1(np.minimum(d, 700.0)))}[estimator]
    a = np.where(m, grad * (np.abs(lp) + np.abs(old) + 1.0) + np.abs(s), 0.0)
    if level in ("token", "seq_all"):
        return s, a
    n = m.sum(-1)
    if level == "seq_sum":
        row = np.array([exact_sum(r) for r in s]) if s.size else np.zeros(s.shape[0])
        ra = a.sum(-1)
    elif level == "seq_mean":
        row = np.array([exact_sum(r) for r in s]) / np.maximum(n, 1) if s.size else np.zeros(s.shape[0])
        ra = a.sum(-1) / np.maximum(n, 1)
    else:  # seq_max
        big = np.where(m, s, -np.inf)
        row = np.where(n > 0, big.max(-1) if s.shape[1] else 0.0, 0.0)
        ra = np.where(m, a, 0.0).max(-1) if s.shape[1] else np.zeros(s.shape[0])
    shape = s.shape
    return np.broadcast_to(row[:, None], shape).copy(), np.broadcast_to(ra[:, None], shape).copy()


def _keep_option(log_prob, old_log_prob, mask, level, estimator, lower, upper, margin=0.0):
    """Per-token keep decision of one option (bool [B, T]); ``margin`` widens the bounds (statistic units)."""
    lo, hi = _bounds(estimator, lower, upper)
    s, a = rejection_statistics(log_prob, old_log_prob, mask, level, estimator)
    pad = margin * a if np.ndim(margin) or margin else 0.0
    inside = s <= hi + pad
    if lo is not None:
        inside &= s >= lo - pad
    m = np.asarray(mask, bool)
    if level == "seq_all":
        inside = np.broadcast_to((inside | ~m).all(-1, keepdims=True), m.shape)
    return inside & m


def rollout_rejection_mask(log_prob, old_log_prob, response_mask, options) -> np.ndarray:
    """The kept-token mask [B, T] float64 (1.0 kept, 0.0 rejected or masked) of the AND of ``options``, a
    sequence of ``(level, estimator, lower, upper)`` (module doc; ``lower`` is used by k1 only).

    Inputs: log_prob, old_log_prob [B, T] (any float; masked entries ignored, NaN / inf included),
    response_mask [B, T] (bool or 0/1). Raises ValueError for an unknown level / estimator or bounds
    that are not 0 < lower ≤ upper (k1) / upper > 0."""
    m = np.asarray(response_mask, bool)
    keep = m.copy()
    for level, estimator, lower, upper in options:
        keep &= _keep_option(log_prob, old_log_prob, m, level, estimator, lower, upper)
    return keep.astype(np.float64)


def _mean(x):
    x = np.asarray(x, np.float64).ravel()
    return exact_sum(x) / x.size if x.size else float("nan")


def rollout_correction_metrics(log_prob, old_log_prob, response_mask, kept, *, is_cap: float = 2.0,
                               log_ratio_clamp: float | None = None) -> dict:
    """The diagnostics of one batch (Python floats), given the kept mask of :func:`rollout_rejection_mask`.
    Token-weighted quantities average over valid tokens, per-row ones over the rows with a valid token
    (a row with none, e.g. an all-observation multi-turn row or a row an earlier filter rejected, has no
    ratio, perplexity or rejection to report):

    * ``rs_masked_fraction``: rejected valid tokens / valid tokens (verl ``rollout_rs_masked_fraction``);
    * ``rs_seq_masked_fraction``: rows with a rejected valid token / rows with a valid token;
    * ``is_mean``: token mean of the truncated IS weight w = min(e^{clamp(Δ, ±c)}, is_cap) (verl
      ``rollout_is_mean``, rollout_is="token");
    * ``is_fraction_high`` / ``is_fraction_low``: token fraction of the *raw* weight e^{clamp(Δ, ±c)} above
      is_cap / below 1/is_cap (before truncation: a truncated weight is never above the cap);
    * ``is_ess``: effective sample size fraction (Σ w)² / (n Σ w²) ∈ (0, 1] of the truncated weights (Kong
      1992; verl ``rollout_is_eff_sample_size`` = 1 / mean((w / mean w)²)): 1 when all weights are equal, at
      any scale, however small;
    * ``kl``: token mean of −Δ (KL(π_rollout ‖ π_train), verl ``kl``); ``k3_kl``: token mean of e^Δ − 1 − Δ;
    * ``chi2_token``: token mean of e^{2 clamp(Δ, ±c)} − 1; ``chi2_seq``: row mean of e^{2 clamp(ΣΔ, ±c)} − 1
      (verl ``compute_offpolicy_metrics``, χ² divergence E[ρ²] − 1);
    * ``training_ppl`` / ``rollout_ppl``: row mean of exp(−row mean of log_prob / old_log_prob);
      ``log_ppl_diff``: row mean of (row mean old_log_prob − row mean log_prob); ``ppl_ratio``: row mean of
      exp of that.

    ``log_ratio_clamp``: None (the exact quantities, below with clamp(Δ, ±c) read as Δ) or c: each token's
    and each row's log-ratio is clamped to [−c, c] before exp, a convention an engine declares (verl's
    ``SAFETY_BOUND`` = 20 in ``compute_rollout_correction_weights`` and ``compute_offpolicy_metrics``).

    Raises ValueError when the mask has no valid token (nothing is defined)."""
    m, lp, old, d = _delta(log_prob, old_log_prob, response_mask)
    if not m.any():
        raise ValueError("no valid token: no rollout-correction metric is defined")
    kept = np.asarray(kept, bool) & m
    rows = m.any(-1)
    n = m.sum(-1)
    dv = d[m]
    c = math.inf if log_ratio_clamp is None else float(log_ratio_clamp)
    with np.errstate(over="ignore"):
        raw = np.exp(np.clip(dv, -c, c))
    w = np.minimum(raw, is_cap)
    # ESS in a scale-free form, from the log-weights (w / max(w)) so that nothing underflows
    lw = np.minimum(np.clip(dv, -c, c), math.log(is_cap))
    wn = np.exp(lw - lw.max())
    ess = exact_sum(wn) ** 2 / (wn.size * exact_sum(wn * wn))
    row_sum = np.array([exact_sum(r) for r in d])
    lp_mean = np.array([exact_sum(r) for r in lp]) / np.maximum(n, 1)
    old_mean = np.array([exact_sum(r) for r in old]) / np.maximum(n, 1)
    diff = (old_mean - lp_mean)[rows]
    with np.errstate(over="ignore"):
        return {
            "rs_masked_fraction": float((m & ~kept).sum() / m.sum()),
            "rs_seq_masked_fraction": float(((m & ~kept).any(-1) & rows).sum() / rows.sum()),
            "is_mean": _mean(w),
            "is_fraction_high": _mean(raw > is_cap),
            "is_fraction_low": _mean(raw < 1.0 / is_cap),
            "is_ess": float(ess),
            "kl": _mean(-dv),
            "k3_kl": _mean(np.expm1(dv) - dv),
            "chi2_token": _mean(np.exp(2 * np.clip(dv, -c, c))) - 1.0,
            "chi2_seq": _mean(np.exp(2 * np.clip(row_sum[rows], -c, c))) - 1.0,
            "training_ppl": _mean(np.exp(-lp_mean[rows])),
            "rollout_ppl": _mean(np.exp(-old_mean[rows])),
            "log_ppl_diff": _mean(diff),
            "ppl_ratio": _mean(np.exp(diff)),
        }

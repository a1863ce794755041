"""Importance ratios π_θ/π_old per token and per sequence, truncated or not, and their gradients.

With Δ_{i,t} = log_prob − old_log_prob at the valid tokens of row i (n_i of them):

======================  =====================================  ========================================
level                   ratio at every valid token of row i    engines
======================  =====================================  ========================================
``token``               r_{i,t} = exp(Δ_{i,t})                 PPO ratio; verl rollout_is="token";
                                                               SkyRL tis_ratio_type="token"
``sequence_geometric``  s_i = exp(Σ_t Δ_{i,t} / n_i)           GSPO's sequence ratio (Zheng et al. 2025,
                        (the geometric mean of the r_{i,t})    arXiv:2507.18071, eq. 7); verl/SkyRL gspo
``sequence_product``    S_i = exp(Σ_t Δ_{i,t})                 verl rollout_is="sequence"; SkyRL
                        (the product of the r_{i,t})           tis_ratio_type="sequence"
======================  =====================================  ========================================

Both sequence levels are called "sequence-level" in the field; the engines' ``"sequence"`` option is
the product, GSPO's is the geometric mean. There is deliberately no level called ``"sequence"``.

log_ratio_clamp (as the engines, for stability): the log-ratio that enters ``exp`` — Δ_{i,t} for
``token``, the row's mean or sum for the sequence levels — is clamped first (verl and SkyRL use ±20
for IS weights; GSPO clamps the combined log-ratio at max 10, see :func:`policy_loss`). cap
(truncated importance sampling, TIS; Yao et al. 2025, "Your efficient RL framework secretly brings
you off-policy RL training"): ``min(ratio, cap)``. band (IcePop, verl ``rollout_is_threshold="lower_upper"``): a
token whose ratio lies outside ``[lower, upper]`` gets weight 0 (and no gradient); a batch with every ratio
outside has every weight 0.

Extreme log-ratios: without clamp or cap the exact ratio is returned: finite in float64 for
log-ratios up to 709.78 (e^100 ≈ 2.69e43 is finite here, but exceeds the fp32 range, where the
correctly rounded result is +inf); +inf beyond. Masked positions hold 0 (value and gradient)
whatever the inputs hold there; rows with no valid token have no ratio (all positions masked).
"""

from __future__ import annotations

import math

import numpy as np

from ._convert import as_float64
from ._policy_common import clamp_with_pass, exp_dd, fsum_rows, log_ratio, masked_inputs, parse_clamp

__all__ = ["IMPORTANCE_LEVELS", "importance_ratio", "importance_ratio_grad"]

IMPORTANCE_LEVELS = ("token", "sequence_geometric", "sequence_product")


def _check(level, cap, band=None):
    if level not in IMPORTANCE_LEVELS:
        hint = (" ('sequence' is ambiguous: the engines' 'sequence' IS weight is 'sequence_product', "
                "GSPO's sequence ratio is 'sequence_geometric')") if level == "sequence" else ""
        raise ValueError(f"unknown importance-ratio level {level!r}; expected one of: "
                         f"{', '.join(IMPORTANCE_LEVELS)}{hint}")
    if cap is not None and not (float(cap) > 0 and not math.isnan(float(cap))):
        raise ValueError(f"cap must be > 0 (or None), got {cap!r}")
    if band is not None:
        if cap is not None:
            raise ValueError("give a TIS cap or an IcePop band, not both")
        lower, upper = (float(x) for x in band)
        if not 0 < lower < upper:
            raise ValueError(f"band must be (lower, upper) with 0 < lower < upper, got {band!r}")


def _ratio(log_prob, old_log_prob, response_mask, level, cap, log_ratio_clamp, band=None):
    """(m, ratio [B,T] with 0 at masked, pass [B,T]: 1.0 where d ratio / d (its log-ratio) = ratio, counts)."""
    _check(level, cap, band)
    lo, hi = parse_clamp(log_ratio_clamp)
    m, a = masked_inputs(response_mask, log_prob=log_prob, old_log_prob=old_log_prob)
    s, e = log_ratio(a["log_prob"], a["old_log_prob"])  # Δ = s + e exactly
    counts = m.sum(axis=1)
    if level == "token":
        lr = s
    else:
        sums = fsum_rows(s, m, e)
        if level == "sequence_geometric":
            sums = sums / np.maximum(counts, 1)
        lr = np.broadcast_to(sums[:, None], s.shape)
        e = np.zeros(s.shape)
    lrc, passes = clamp_with_pass(lr, lo, hi)
    r = exp_dd(lrc, np.where(passes > 0, e, 0.0))
    if cap is not None:
        passes = passes * (r <= float(cap))
        r = np.minimum(r, float(cap))
    if band is not None:
        inside = (r >= float(band[0])) & (r <= float(band[1]))
        passes, r = passes * inside, np.where(inside, r, 0.0)
    return m, np.where(m, r, 0.0), np.where(m, passes, 0.0), counts


def importance_ratio(log_prob, old_log_prob, response_mask, *, level: str = "token", cap=None,
                     log_ratio_clamp=None, band=None) -> np.ndarray:
    """Importance ratio at every valid token: float64 ``[B, T]``, 0 at masked positions.

    log_prob, old_log_prob: ``[B, T]`` log π_θ and log π_old of the sampled tokens (any real dtype,
    NumPy or torch); response_mask: ``[B, T]`` bool/0-1. level: one of :data:`IMPORTANCE_LEVELS`
    (module doc). cap: None, or the TIS cap c > 0 (ratio → min(ratio, c)). log_ratio_clamp: None,
    a number c (clamp to [−c, c]) or a pair (lo, hi) with None for an open side, applied to the
    log-ratio that enters exp. band: None, or the IcePop band (lower, upper): a ratio outside it becomes 0
    (module doc). The sequence levels broadcast one value over the row's valid tokens.
    Accuracy: token ≤ ~2 ulps relative (Δ is kept exact as a double-double); sequence levels: the
    row sum is exactly rounded (fsum), so ≤ ~2 + |log-ratio| ulps relative (exp's condition number).
    Raises ValueError: unknown level (also for the ambiguous ``"sequence"``), cap ≤ 0, a cap and a band, a
    band not 0 < lower < upper, bad clamp,
    shapes not [B, T] or differing, NaN/±inf at a valid token.
    """
    _, r, _, _ = _ratio(log_prob, old_log_prob, response_mask, level, cap, log_ratio_clamp, band)
    return r


def importance_ratio_grad(log_prob, old_log_prob, response_mask, *, level: str = "token", cap=None,
                          log_ratio_clamp=None, band=None, grad_output=None) -> np.ndarray:
    """Vector–Jacobian product ``Σ_{i,t'} grad_output[i,t'] · ∂ratio[i,t'] / ∂log_prob[i,t]``: ``[B, T]``.

    grad_output: ``[B, T]`` (broadcastable; default ones; its masked entries are ignored).
    token: g·r·pass. sequence_geometric: (Σ_{t' valid} g_{i,t'})·s_i·pass_i / n_i at every valid t.
    sequence_product: (Σ_{t' valid} g_{i,t'})·S_i·pass_i. pass is 0 where a clamp or the cap is
    active (value above the cap; the gradient passes at exactly the cap and at the clamp bounds,
    torch's convention), else 1. Masked entries are exactly 0. The gradient w.r.t. old_log_prob
    is the negative (engines treat π_old as a constant).
    Raises ValueError as :func:`importance_ratio`.
    """
    m, r, passes, counts = _ratio(log_prob, old_log_prob, response_mask, level, cap, log_ratio_clamp, band)
    go = np.ones(m.shape) if grad_output is None else as_float64(grad_output, "grad_output")
    try:
        go = np.broadcast_to(go, m.shape)
    except ValueError:
        raise ValueError(f"grad_output has shape {go.shape}, expected (broadcastable to) {m.shape}") from None
    go = np.where(m, go, 0.0)
    if not np.isfinite(go).all():
        raise ValueError("grad_output has a non-finite entry at a valid token")
    with np.errstate(invalid="ignore"):
        local = np.where(passes > 0, r, 0.0)  # d ratio / d log-ratio
        if level == "token":
            g = go * local
        else:
            gsum = fsum_rows(go, m)[:, None]
            g = gsum * local
            if level == "sequence_geometric":
                g = g / np.maximum(counts, 1)[:, None]
    return np.where(m, g, 0.0)

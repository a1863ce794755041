"""Optimal token baseline advantages verl PR #6153, exact in float64 and without epsilon."""

from __future__ import annotations

import numpy as np

from ._compensated import cumsum_lastdim, sum_lastdim, two_sum
from ._convert import as_float64, as_mask, is_tensor_like

__all__ = ["optimal_token_baseline"]


def _masked_finite(x, mask, name):
    """x as float64 with masked-out entries set to 0; an unmasked non-finite entry raises ValueError."""
    a = as_float64(x, name)
    if a.shape != mask.shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {mask.shape} (the response mask's shape)")
    bad = mask & ~np.isfinite(a)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} has a non-finite unmasked entry {a[pos]!r} at {pos}")
    return np.where(mask, a, 0.0)


def optimal_token_baseline(
    token_level_rewards,
    response_mask,
    index,
    old_log_probs,
    sum_pi_squared,
    rollout_is_weights=None,
    handle_zero_tail: bool = True,
):
    """Advantages with the optimal per-token baseline of each prompt group; returns (advantages, returns).

    Inputs (NumPy arrays or torch tensors, any real dtype): token_level_rewards ``[B, T]``;
    response_mask ``[B, T]`` bool or 0/1; index ``[B]`` group ids (any hashable values: ints, uid
    strings); old_log_probs ``[B, T]`` (log π_t of the sampled token, nats); sum_pi_squared ``[B, T]``
    (Σπ² of the sampling distribution at each position); rollout_is_weights ``[B, T]`` or None.
    Masked-out entries of every input are ignored whatever they hold; an unmasked NaN/±inf raises
    ValueError, as do shape mismatches and an index whose length is not B.
    Returns two float64 ``[B, T]`` arrays.

    Formula (verl 0.9.1 ``compute_optimal_token_baseline_advantage``):
        G_t   = Σ_{j ≥ t} r_j·m_j                        (returns: reward-to-go; not masked afterwards)
        w_t   = 1 − 2π_t + Σπ²_t,  π_t = exp(old_log_prob_t)   (= ‖∇ log π‖² proxy, ≥ 0 in exact math)
        w_t  *= ρ_t²                                      (if rollout_is_weights ρ is given)
        W_t   = Σ_{j ≤ t} w_j·m_j                         (cumulative path-variance proxy)
        per group g with N ≥ 2 members:  B_t = Σ_{i∈g} G_{i,t}·W_{i,t}·m_{i,t} / Σ_{i∈g} W_{i,t}·m_{i,t}
        groups of size 1: B = 0 (advantage = return)
        handle_zero_tail: if exactly one member has the strict maximum length L1 = Σ_t m > L2 (the
            second largest length in the group), its B[L2:] = 0 (column positions, right padding)
        advantages = (G − B)·m

    Differences from verl, on purpose: no epsilon in the denominator — where Σ_i W·m is exactly 0 the
    baseline is 0 (verl: 0/(0 + 1e-8) = 0 there too, but verl also biases every other B_t by ε/ΣW);
    masked entries never leak NaN/inf into results (verl multiplies them by 0).

    Limits: ρ² must not underflow (|ρ| ≳ 1e-154), or a weight that is tiny but non-zero in exact
    arithmetic becomes 0 and can turn a baseline into 0.
    Accuracy: w_t is computed as (Σπ² − 1) − 2·expm1(log π) with TwoSum (no cancellation from a
    rounded π when π → 1); returns and W are compensated cumulative sums; B_t = Σ_i G_i·(W_i m_i / ΣW·m)
    with compensated pairwise sums over the group (normalised weights: no underflow of G·W). So each
    B_t is accurate to a few ulps of Σ_i (|G|·Ŵ)_i / |Σ W·m|, where Ŵ accumulates the size of w's terms,
    |Σπ² − 1| + 2|expm1(log π)| (times ρ²): w itself may cancel, e.g. when π → 1 and Σπ² → 1.
    Source: verl PR #6153 (verl PR #6153); the optimal-baseline derivation in its docstring
    (B_t* = E[G_t·W_t] / E[W_t]).
    """
    rewards0 = as_float64(token_level_rewards, "token_level_rewards")
    if rewards0.ndim != 2:
        raise ValueError(f"token_level_rewards must be [B, T], got shape {rewards0.shape}")
    mask = as_mask(response_mask, rewards0.shape, "response_mask")
    bsz, seqlen = mask.shape
    rewards = _masked_finite(rewards0, mask, "token_level_rewards")
    logp = _masked_finite(old_log_probs, mask, "old_log_probs")
    s2 = _masked_finite(sum_pi_squared, mask, "sum_pi_squared")
    if is_tensor_like(index):
        index = index.detach().cpu().numpy()
    ids = np.asarray(index, dtype=object).reshape(-1).tolist() if np.ndim(index) else None
    if ids is None or len(ids) != bsz:
        raise ValueError(f"index must have one group id per sequence (length {bsz}), got shape {np.shape(index)}")

    returns = cumsum_lastdim(rewards, reverse=True)

    # w = (S − 1) − 2·expm1(logp), as an almost exactly rounded 3-term sum
    a, ea = two_sum(s2, -1.0)
    b, eb = two_sum(a, -2.0 * np.expm1(logp))
    w = b + (ea + eb)
    if rollout_is_weights is not None:
        rho = _masked_finite(rollout_is_weights, mask, "rollout_is_weights")
        w = w * (rho * rho)
    w = np.where(mask, w, 0.0)
    big_w = cumsum_lastdim(w)

    groups: dict = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)

    baselines = np.zeros((bsz, seqlen))
    lengths = mask.sum(axis=1)
    for members in groups.values():
        if len(members) < 2:
            continue
        rows = np.asarray(members)
        wm = np.where(mask[rows], big_w[rows], 0.0)  # [N, T]
        den = sum_lastdim(np.ascontiguousarray(wm.T))
        nonzero = den != 0.0
        # B = Σ G·(W/ΣW): normalising first keeps tiny-but-valid weights from underflowing in G·W
        frac = wm / np.where(nonzero, den, 1.0)
        base = np.where(nonzero, sum_lastdim(np.ascontiguousarray((returns[rows] * frac).T)), 0.0)
        baselines[rows] = base
        if handle_zero_tail:
            lens = lengths[rows]
            order = np.sort(lens)
            l1, l2 = int(order[-1]), int(order[-2])
            longest = np.flatnonzero(lens == l1)
            if longest.size == 1 and l1 > l2:
                baselines[rows[longest[0]], l2:] = 0.0

    advantages = np.where(mask, returns - baselines, 0.0)
    return advantages, returns

"""The clipped value-function (critic) loss of PPO and its gradient w.r.t. the value predictions.

Per token, with v = vpreds, v_old = values (the critic's values at rollout time), R = returns and
ε = cliprange_value: v_clip = clamp(v, v_old − ε, v_old + ε), and

    L = max((v − R)², (v_clip − R)²)          (cliprange_value None: L = (v − R)²)

    loss = ½ · agg_loss(L, response_mask, loss_agg_mode)

the pessimistic clipped objective of PPO's critic (OpenAI baselines ppo2; verl 0.9.1
``core_algos.compute_value_loss``, TRL's PPOTrainer; SkyRL 0.4.0 ``ppo_utils.ppo_critic_loss``, which
writes v_clip = v_old + clamp(v − v_old, −ε, ε), the same value up to rounding).
Metric vf_clipfrac: the valid tokens where the clipped term is strictly larger, [(v_clip − R)² >
(v − R)²] (verl's vf_clipfrac; SkyRL's clipfrac).

Gradient ∂loss/∂v = ½·w·∂L/∂v with w the agg_loss weights: 2(v − R) from the unclipped term;
2(v_clip − R) from the clipped one inside [v_old − ε, v_old + ε] (bounds included, torch's clamp;
verl's ``clip_by_value`` = max(min(v, hi), lo) halves it at exactly a bound), 0 outside; at a tie
of the two terms the mean of the two (torch's maximum). Inside the clip range the two terms are
equal and so are their gradients.

SkyRL aggregates differently: ½·(1/B)·Σ_i [Σ_t L·m / max(n_i, 1)] over *all* B rows (empty rows
count 0) — seq-mean-token-mean when no row is empty.
"""

from __future__ import annotations

import math

import numpy as np

from ._policy_common import agg_weights, masked_inputs, max_with_grad, sum_count
from .loss_agg import agg_loss

__all__ = ["value_loss", "value_loss_grad"]


def _terms(vpreds, values, returns, response_mask, cliprange_value):
    m, a = masked_inputs(response_mask, vpreds=vpreds, values=values, returns=returns)
    v, v_old, R = a["vpreds"], a["values"], a["returns"]
    e1 = v - R
    L1, g1 = e1 * e1, 2.0 * e1
    if cliprange_value is None:
        return m, L1, g1, {}
    eps = float(cliprange_value)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"cliprange_value must be finite and >= 0 (or None), got {cliprange_value!r}")
    lo, hi = v_old - eps, v_old + eps
    vc = np.clip(v, lo, hi)
    inside = ((v >= lo) & (v <= hi)).astype(np.float64)
    e2 = vc - R
    L2, g2 = e2 * e2, 2.0 * e2 * inside
    L, g = max_with_grad(L1, L2, g1, g2)
    return m, L, g, {"vf_clipfrac": sum_count((L2 > L1).astype(float), m)}


def value_loss(vpreds, values, returns, response_mask, cliprange_value, loss_agg_mode: str = "token-mean", *,
               loss_scale_factor=None):
    """``(loss: float, metrics: dict[str, SumCount])`` of the clipped value loss (module doc).

    vpreds, values, returns: ``[B, T]`` (any real dtype, NumPy or torch); response_mask: ``[B, T]``
    bool/0-1; cliprange_value: ε ≥ 0 or None (no clipping: no metric); loss_agg_mode,
    loss_scale_factor: as :func:`rlconform.reference.agg_loss`. Note the argument order (values
    before returns, as this signature); verl's compute_value_loss takes (vpreds, returns, values, …).
    Returns ½·agg_loss of the per-token loss (``nan`` for an empty batch except with token-sum) and
    ``{"vf_clipfrac": SumCount}``. Masked positions are ignored whatever they hold.
    Accuracy: per-token terms within a few ulps; aggregation exactly rounded.
    Raises ValueError: shapes, NaN/±inf at a valid position, bad cliprange_value or mode.
    """
    m, L, _, metrics = _terms(vpreds, values, returns, response_mask, cliprange_value)
    return 0.5 * agg_loss(np.where(m, L, 0.0), m, loss_agg_mode, loss_scale_factor), metrics


def value_loss_grad(vpreds, values, returns, response_mask, cliprange_value, loss_agg_mode: str = "token-mean", *,
                    loss_scale_factor=None, grad_output=1.0) -> np.ndarray:
    """∂ value_loss / ∂ vpreds times the scalar ``grad_output``: float64 ``[B, T]``, exactly 0 at
    masked positions (module doc). The gradient w.r.t. values and returns is not provided.
    Raises ValueError as :func:`value_loss`.
    """
    go = float(grad_output)
    if not math.isfinite(go):
        raise ValueError(f"grad_output must be finite, got {grad_output!r}")
    m, _, g, _ = _terms(vpreds, values, returns, response_mask, cliprange_value)
    w = agg_weights(m, loss_agg_mode, loss_scale_factor)
    return np.where(m, 0.5 * go * w * g, 0.0)

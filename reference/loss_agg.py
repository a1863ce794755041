"""Loss aggregation over a whole global batch: the value every partition of it must reproduce.

An engine computes ``agg_loss`` per micro-batch (and per DP / CP rank) and combines the pieces by the
rule its binding declares (summed over micro-batches, averaged over DP ranks, ...); for every partition
the combination must equal ``agg_loss`` of the reference applied to the whole global batch at once.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ._convert import as_float64, as_mask
from .exact_sum import exact_sum

__all__ = ["LOSS_AGG_MODES", "agg_loss", "agg_loss_grad"]

#: The loss aggregation modes, by their verl names.
LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def agg_loss(loss_mat, mask, mode: str, loss_scale_factor=None) -> float:
    """Aggregate a per-token loss matrix over the whole global batch; returns a Python float.

    loss_mat: ``[B, T]`` any real dtype (or torch tensor); mask: ``[B, T]`` bool or 0/1 (the loss /
    response mask). Masked-out entries are ignored whatever they hold; an unmasked NaN/±inf raises
    ValueError. nnz = Σ mask; a sequence is *non-empty* when it has ≥ 1 unmasked token; n_seq = number
    of non-empty sequences.

    ==========================  =========================================================  ==========
    mode                        value                                                      nnz = 0
    ==========================  =========================================================  ==========
    token-mean                  Σ(loss·mask) / nnz                                         nan
    token-sum                   Σ(loss·mask)                                               0.0
    seq-mean-token-sum          Σ_i Σ_t(loss·mask) / n_seq                                 nan
    seq-mean-token-mean         Σ_i [Σ_t(loss·mask) / Σ_t mask]_i / n_seq                  nan
    seq-mean-token-sum-norm     seq-mean-token-sum / loss_scale_factor                     nan
    ==========================  =========================================================  ==========

    (token-sum of nothing is the empty sum, 0.0: an empty global batch contributes nothing; the other
    modes divide by nnz or n_seq and are undefined.)

    loss_scale_factor: only for ``seq-mean-token-sum-norm`` (ignored by the other modes, as in verl); a
    positive constant normaliser; default ``T = mask.shape[-1]``. It must be the same constant for
    every micro-batch: verl's default (the micro-batch's own padded length) is partition-dependent
    whenever micro-batches are padded to different lengths, so bindings should pass it explicitly.

    Accuracy: token-mean / seq-mean-token-sum(-norm): the masked sum is exactly rounded (math.fsum)
    and divided once (≤ 1 ulp). seq-mean-token-mean: per-sequence fsum/count, then fsum of the means
    / n_seq (≤ ~2 ulps of Σ|per-sequence mean| / n_seq).

    Raises ValueError: unknown mode (the message lists LOSS_AGG_MODES), shapes not equal or not 2-D,
    non-0/1 mask, non-finite unmasked loss, loss_scale_factor not finite and > 0.
    Source: verl ``core_algos.agg_loss`` (verl 0.9.1); seq-mean-token-sum-norm is Dr. GRPO's constant
    normaliser (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective").
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of: {', '.join(LOSS_AGG_MODES)}")
    loss = as_float64(loss_mat, "loss_mat")
    if loss.ndim != 2:
        raise ValueError(f"loss_mat must be [B, T], got shape {loss.shape}")
    m = as_mask(mask, loss.shape)
    bad = m & ~np.isfinite(loss)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"loss_mat has a non-finite unmasked entry {loss[pos]!r} at {pos}")

    sel = loss[m]
    nnz = sel.size
    if mode == "token-sum":
        return exact_sum(sel.tolist())
    if mode == "token-mean":
        return exact_sum(sel.tolist()) / nnz if nnz else math.nan

    counts = m.sum(axis=1)
    n_seq = int(np.count_nonzero(counts))
    if mode == "seq-mean-token-mean":
        if n_seq == 0:
            return math.nan
        means = [exact_sum(loss[i][m[i]].tolist()) / int(counts[i]) for i in np.flatnonzero(counts)]
        return exact_sum(means) / n_seq

    # seq-mean-token-sum(-norm): Σ over non-empty sequences of their token sums = the masked total
    if mode == "seq-mean-token-sum-norm":
        scale = loss.shape[-1] if loss_scale_factor is None else loss_scale_factor
        scale = float(scale.item() if hasattr(scale, "item") else scale)
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"loss_scale_factor must be finite and > 0, got {scale!r}")
    else:
        scale = 1.0
    if n_seq == 0:
        return math.nan
    return float(Fraction(exact_sum(sel.tolist())) / (n_seq * Fraction(scale)))


def agg_loss_grad(loss_mat, mask, mode: str, loss_scale_factor=None, grad_output: float = 1.0) -> np.ndarray:
    """d agg_loss / d loss_mat ``[B, T]`` float64: the weight each token's loss gets in the optimizer step.

    ==========================  =========================================  ===========================
    mode                        weight of an unmasked token (i, t)          nnz = 0 (or no sequence)
    ==========================  =========================================  ===========================
    token-mean                  1 / nnz                                     NaN everywhere (undefined)
    token-sum                   1                                           0 everywhere
    seq-mean-token-sum          1 / n_seq                                   NaN
    seq-mean-token-mean         1 / (n_seq · Σ_t mask[i])                   NaN
    seq-mean-token-sum-norm     1 / (n_seq · loss_scale_factor)             NaN
    ==========================  =========================================  ===========================

    Masked tokens get exactly 0 whatever they hold (a loss whose numerator sums them gives them
    weight: “masked tokens in the loss numerator”). Times ``grad_output``. Raises as :func:`agg_loss`.
    Source: the closed form of :func:`agg_loss` (verl ``core_algos.agg_loss``).
    """
    agg_loss(np.where(as_mask(mask, np.shape(as_float64(loss_mat, "loss_mat"))), as_float64(loss_mat, "loss_mat"), 0.0),
             mask, mode, loss_scale_factor)  # validates the arguments
    loss = as_float64(loss_mat, "loss_mat")
    m = as_mask(mask, loss.shape)
    counts = m.sum(axis=1)
    nnz, n_seq = int(m.sum()), int(np.count_nonzero(counts))
    g = float(grad_output)
    if mode == "token-sum":
        return np.where(m, g, 0.0)
    if (mode == "token-mean" and nnz == 0) or (mode != "token-mean" and n_seq == 0):
        return np.full(loss.shape, np.nan)
    if mode == "token-mean":
        w = np.full(loss.shape, 1.0 / nnz)
    elif mode == "seq-mean-token-sum":
        w = np.full(loss.shape, 1.0 / n_seq)
    elif mode == "seq-mean-token-mean":
        w = 1.0 / (n_seq * np.maximum(counts, 1))[:, None] * np.ones(loss.shape)
    else:
        scale = loss.shape[-1] if loss_scale_factor is None else loss_scale_factor
        scale = float(scale.item() if hasattr(scale, "item") else scale)
        w = np.full(loss.shape, 1.0 / (n_seq * scale))
    return np.where(m, w * g, 0.0)

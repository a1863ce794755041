"""Helpers shared by the policy-loss family of references (private): masked inputs, aggregation
weights, torch's conventions at kinks, log-ratio clamps, and two accurate elementary functions.

Conventions at kinks (points where a piecewise formula is not differentiable) follow torch's
autograd, so that the reference and an engine written with torch agree even there:

* ``clamp(x, lo, hi)`` passes the gradient for ``lo <= x <= hi`` (bounds included), 0 outside;
* ``maximum(a, b)`` / ``minimum(a, b)`` at a tie ``a == b`` give each argument half the gradient
  (torch ``derivatives.yaml``: ``at::where(self == other, grad / 2, grad)``);
* ``abs`` has gradient ``sign(x)`` with ``sign(0) = 0``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ._compensated import two_sum
from ._convert import as_float64, as_mask
from .exact_sum import exact_sum
from .loss_agg import LOSS_AGG_MODES

__all__ = [
    "SumCount",
    "masked_inputs",
    "agg_weights",
    "max_with_grad",
    "min_with_grad",
    "parse_clamp",
    "clamp_with_pass",
    "exp_minus_one_minus",
    "sigmoid_pair",
    "fsum_rows",
    "sum_count",
    "log_ratio",
    "exp_dd",
]


class SumCount(NamedTuple):
    """A token-weighted metric as its sufficient statistics: ``total`` = Σ over valid tokens of the
    per-token quantity (float; exactly rounded), ``count`` = number of valid tokens (int).

    Partition invariant by construction: the metric of a global batch is the sum of the shards'
    totals over the sum of their counts (never a mean of shard means). ``mean`` is ``total / count``
    (``nan`` for ``count == 0``). Fractions (clip fractions) have an integer-valued ``total``.
    """

    total: float
    count: int

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan


def sum_count(values: np.ndarray, m: np.ndarray, low=None) -> SumCount:
    """SumCount of ``values`` (+ ``low``, the low parts of double-doubles) over the True entries of
    ``m`` (fsum: exactly rounded)."""
    terms = values[m].tolist() + ([] if low is None else low[m].tolist())
    return SumCount(exact_sum(terms), int(m.sum()))


def masked_inputs(mask, mask_name: str = "response_mask", **arrays):
    """Validate ``[B, T]`` inputs and neutralise their masked entries.

    Returns ``(m, out)``: ``m`` a bool ``[B, T]`` mask; ``out[name]`` a float64 copy of each array with
    every masked entry replaced by 0.0, so that whatever a masked position holds (NaN, ±inf, 1e30)
    cannot reach a value or a gradient of the unmasked result. ``None`` arrays are passed through.
    Raises ValueError: an array not 2-D, shapes that differ, a mask that is not bool/0-1, or a NaN /
    ±inf at an unmasked position (the references are defined on finite data).
    """
    shape = None
    out = {}
    for name, a in arrays.items():
        if a is None:
            out[name] = None
            continue
        x = np.array(as_float64(a, name), dtype=np.float64, copy=True)
        if x.ndim != 2:
            raise ValueError(f"{name} must be [B, T], got shape {x.shape}")
        if shape is None:
            shape = x.shape
        elif x.shape != shape:
            raise ValueError(f"{name} has shape {x.shape}, expected {shape} (the shape of the other inputs)")
        out[name] = x
    m = as_mask(mask, shape, mask_name)
    for name, x in out.items():
        if x is None:
            continue
        bad = m & ~np.isfinite(x)
        if bad.any():
            pos = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{name} has a non-finite unmasked entry {x[pos]!r} at {pos}")
        x[~m] = 0.0
    return m, out


def agg_weights(m: np.ndarray, mode: str, loss_scale_factor=None) -> np.ndarray:
    """∂ agg_loss(loss_mat, m, mode) / ∂ loss_mat: a float64 ``[B, T]`` array, 0 at masked entries.

    token-mean 1/nnz; token-sum 1; seq-mean-token-sum 1/n_seq; seq-mean-token-mean 1/(n_seq·n_i);
    seq-mean-token-sum-norm 1/(n_seq·loss_scale_factor) (default scale T), with n_i the valid tokens
    of row i and n_seq the number of non-empty rows (see :func:`rlconform.reference.agg_loss`).
    An empty batch (nnz = 0) gives all zeros. Raises ValueError for an unknown mode or a scale that
    is not finite and > 0.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of: {', '.join(LOSS_AGG_MODES)}")
    mf = m.astype(np.float64)
    counts = m.sum(axis=1)
    nnz = int(counts.sum())
    n_seq = int(np.count_nonzero(counts))
    if nnz == 0:
        return np.zeros(m.shape)
    if mode == "token-mean":
        return mf / nnz
    if mode == "token-sum":
        return mf
    if mode == "seq-mean-token-sum":
        return mf / n_seq
    if mode == "seq-mean-token-mean":
        per_row = np.where(counts > 0, 1.0 / (n_seq * np.maximum(counts, 1).astype(np.float64)), 0.0)
        return mf * per_row[:, None]
    scale = m.shape[-1] if loss_scale_factor is None else loss_scale_factor
    scale = float(scale.item() if hasattr(scale, "item") else scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"loss_scale_factor must be finite and > 0, got {scale!r}")
    return mf / (n_seq * scale)


def max_with_grad(a, b, ga, gb):
    """``(maximum(a, b), its gradient)`` given the gradients ``ga``, ``gb`` of a and b; ties split."""
    val = np.maximum(a, b)
    grad = np.where(a > b, ga, np.where(a < b, gb, 0.5 * (ga + gb)))
    return val, grad


def min_with_grad(a, b, ga, gb):
    """``(minimum(a, b), its gradient)``; ties split as torch does."""
    val = np.minimum(a, b)
    grad = np.where(a < b, ga, np.where(a > b, gb, 0.5 * (ga + gb)))
    return val, grad


def parse_clamp(log_ratio_clamp):
    """``None`` → (-inf, inf); a number c → (-c, c); a pair (lo, hi) with None for ±inf → (lo, hi)."""
    if log_ratio_clamp is None:
        return -math.inf, math.inf
    if isinstance(log_ratio_clamp, (tuple, list)):
        if len(log_ratio_clamp) != 2:
            raise ValueError(f"log_ratio_clamp must be None, a number or a pair (lo, hi), got {log_ratio_clamp!r}")
        lo, hi = log_ratio_clamp
        lo = -math.inf if lo is None else float(lo)
        hi = math.inf if hi is None else float(hi)
    else:
        c = float(log_ratio_clamp)
        lo, hi = -c, c
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"log_ratio_clamp must satisfy lo <= hi, got {log_ratio_clamp!r}")
    return lo, hi


def clamp_with_pass(x, lo, hi):
    """``(clamp(x, lo, hi), pass)`` with ``pass`` = 1.0 where lo <= x <= hi (torch's clamp gradient)."""
    return np.clip(x, lo, hi), ((x >= lo) & (x <= hi)).astype(np.float64)


def exp_minus_one_minus(d):
    """``exp(d) − 1 − d`` (float64 array), accurate to a few ulps relative for every finite d.

    |d| < 0.5: the Taylor series Σ_{n≥2} dⁿ/n! (27 terms: the tail is below 2⁻⁵⁸ relative);
    otherwise ``expm1(d) − d``, whose two terms cancel by at most a factor ≈ 5 there. Overflows to
    +inf for d > ~709.78 (the value exceeds the float64 range).
    """
    d = np.asarray(d, dtype=np.float64)
    out = np.empty_like(d)
    small = np.abs(d) < 0.5
    ds = d[small]
    term = ds * ds / 2.0
    acc = term.copy()
    for n in range(3, 30):
        term = term * ds / n
        acc += term
    out[small] = acc
    with np.errstate(over="ignore"):
        out[~small] = np.expm1(d[~small]) - d[~small]
    return out


def sigmoid_pair(x):
    """``(σ(x), σ(x)·(1 − σ(x)))`` without overflow, each to a few ulps relative (float64 arrays)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):
        e = np.exp(-np.abs(x))  # in (0, 1]
    one_pe = 1.0 + e
    sig = np.where(x >= 0, 1.0 / one_pe, e / one_pe)
    dsig = e / (one_pe * one_pe)
    return sig, dsig


def fsum_rows(x: np.ndarray, m: np.ndarray, low=None) -> np.ndarray:
    """Exactly rounded Σ_t (x + low)[i, t] over the True entries of row i of ``m``: float64 ``[B]``."""
    return np.array([exact_sum(x[i][m[i]].tolist() + ([] if low is None else low[i][m[i]].tolist()))
                     for i in range(x.shape[0])], dtype=np.float64)


def log_ratio(a, b):
    """``(s, e)`` with s = fl(a − b) and s + e = a − b exactly (TwoSum; e = 0 where s is not finite)."""
    with np.errstate(invalid="ignore", over="ignore"):
        s, e = two_sum(np.asarray(a, dtype=np.float64), -np.asarray(b, dtype=np.float64))
    return s, np.where(np.isfinite(e), e, 0.0)


def exp_dd(s, e):
    """exp(s + e) for |e| ≤ ulp(s)/2 (a double-double log): exp(s)·(1 + e), ≤ ~1 ulp relative.

    Rounding the log-ratio first would cost |s|·eps relative (100 ulps at s = 100)."""
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.exp(s)
        return np.where(np.isfinite(x), x + x * e, x)

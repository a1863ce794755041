"""Masked whitening (verl / SkyRL ``masked_whiten``) with exact, mergeable global statistics.

``masked_whiten(values, mask)`` normalises the unmasked entries of a batch to zero mean and unit
(unbiased) variance: out = (x − μ) / sqrt(σ² + ε), the statistics taken over every unmasked entry of
the batch. A data-parallel (DP) version must use *global* statistics over all DP ranks; they are
mergeable: each rank reduces its rows to ``ExactMoments`` (nnz, Σx, Σx² as exact rationals), the parts
are merged by plain addition (``merge_exact_moments``, exact, so any split of the rows — imbalanced,
empty shards included — gives the bit-identical result), and ``masked_whiten(values, mask,
moments=merged)`` whitens one rank's rows. ``reductions.Moments`` (floats) and
``reductions.ChanMoments`` are accepted as ``moments`` too and converted exactly.

Source: verl 0.9.1 ``verl/utils/torch_functional.py::masked_whiten`` and SkyRL 0.4.0
``skyrl/backends/skyrl_train/utils/ppo_utils.py::masked_whiten`` (the same code over different
``masked_mean`` helpers): ``mean = masked_mean(x, m)``, ``var = masked_var(x, m)`` (unbiased: mean of
squared deviations × nnz/(nnz − 1), ValueError for nnz ≤ 1), ``whitened = (x − mean)·rsqrt(var + 1e-8)``,
``+ mean`` if not ``shift_mean``. verl's masked_mean is Σ where(m, x, 0)·m / (nnz + 1e-8); SkyRL's
(torch_utils.masked_mean) is Σ x·m / max(nnz, 1), through which a NaN/inf at a masked position leaks.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Iterable

import numpy as np

from ._compensated import two_sum
from ._convert import as_float64, as_mask
from .exact_sum import exact_sum
from .reductions import ChanMoments, Moments

__all__ = ["ExactMoments", "exact_moments", "merge_exact_moments", "masked_whiten", "WHITEN_EPS"]

WHITEN_EPS = 1e-8  # added to the variance under the square root, as in verl and SkyRL


@dataclasses.dataclass(frozen=True)
class ExactMoments:
    """Exact partial statistics of a shard for whitening.

    ``nnz``: unmasked entries (int); ``sum`` = Σx and ``sumsq`` = Σx² over the finite unmasked entries,
    as exact ``Fraction``s; ``nonfinite``: how many unmasked entries are NaN or ±inf (then the whitened
    unmasked outputs are NaN). Merge by addition (``merge_exact_moments``); the empty shard is
    ``ExactMoments(0, Fraction(0), Fraction(0), 0)``.
    """

    nnz: int
    sum: Fraction
    sumsq: Fraction
    nonfinite: int = 0

    def mean_var(self, unbiased: bool = True) -> tuple:
        """(μ, σ²) as exact Fractions; ``None`` where undefined (nnz = 0; σ² with nnz − ddof ≤ 0)."""
        if self.nnz == 0:
            return None, None
        mean = self.sum / self.nnz
        ddof = 1 if unbiased else 0
        if self.nnz - ddof <= 0:
            return mean, None
        return mean, (self.sumsq - self.sum * mean) / (self.nnz - ddof)


def _exact_fsum(xs: list) -> Fraction:
    """The exact sum of finite floats as a Fraction: repeated exactly rounded fsum of the residual."""
    total = Fraction(0)
    xs = list(xs)
    while True:
        s = exact_sum(xs)
        if s == 0.0:
            return total
        total += Fraction(s)
        xs.append(-s)


def _square_parts(x: np.ndarray) -> list:
    """x² as hi + lo pairs (Dekker/Veltkamp), so that Σ(hi + lo) is Σx² exactly (|x| < 2**995)."""
    hi = x * x
    c = x * 134217729.0
    xh = c - (c - x)
    xl = x - xh
    lo = ((xh * xh - hi) + 2.0 * xh * xl) + xl * xl
    return hi.tolist() + lo.tolist()


def exact_moments(values, mask) -> ExactMoments:
    """``ExactMoments`` of the unmasked entries of ``values`` (any shape; ``mask`` of the same shape).

    Masked entries are ignored whatever they hold. Finite unmasked entries must satisfy |x| < 2**995
    (so that x² splits exactly); larger ones raise ValueError. Raises ValueError for shape mismatch or
    a non-0/1 mask.
    """
    v = as_float64(values, "values")
    m = as_mask(mask, v.shape)
    sel = v[m]
    fin = np.isfinite(sel)
    x = sel[fin]
    if x.size and float(np.max(np.abs(x))) >= 2.0**995:
        raise ValueError("exact_moments: |x| >= 2**995 cannot be squared exactly in float64 pieces")
    return ExactMoments(int(sel.size), _exact_fsum(x.tolist()), _exact_fsum(_square_parts(x)),
                        int(sel.size - x.size))


def _as_exact(p) -> ExactMoments:
    if isinstance(p, ExactMoments):
        return p
    if isinstance(p, ChanMoments):  # (n, mean, M2): Σx = n·mean, Σx² = M2 + n·mean²
        n, mean, m2 = int(p.n), p.mean, p.m2
        if not (math.isfinite(mean) and math.isfinite(m2)):
            return ExactMoments(n, Fraction(0), Fraction(0), n)
        s = Fraction(mean) * n
        return ExactMoments(n, s, Fraction(m2) + s * Fraction(mean), 0)
    if isinstance(p, Moments):
        if not (math.isfinite(p.sum) and math.isfinite(p.sumsq)):
            return ExactMoments(int(p.nnz), Fraction(0), Fraction(0), int(p.nnz))
        return ExactMoments(int(p.nnz), Fraction(p.sum), Fraction(p.sumsq), 0)
    raise TypeError(f"expected ExactMoments, reductions.Moments or reductions.ChanMoments, got {type(p).__name__}")


def merge_exact_moments(parts: Iterable) -> ExactMoments:
    """Merge shards' statistics by exact addition (associative and commutative: any split, any order,
    same result). Parts may be ``ExactMoments``, ``reductions.Moments`` or ``reductions.ChanMoments``."""
    ps = [_as_exact(p) for p in parts]
    return ExactMoments(sum(p.nnz for p in ps), sum((p.sum for p in ps), Fraction(0)),
                        sum((p.sumsq for p in ps), Fraction(0)), sum(p.nonfinite for p in ps))


def whiten_scale(moments, eps: float = WHITEN_EPS) -> tuple:
    """(μ, s) of the whitening map x ↦ (x − μ)/s defined by global statistics; (None, None) if nnz = 0.

    μ is an exact Fraction; s = sqrt(σ² + eps) a float (within 1 ulp), where σ² is the unbiased
    variance, and σ² := 0 when nnz = 1 (see ``masked_whiten``). (nan, nan) if a non-finite entry
    was counted.
    """
    mo = _as_exact(moments)
    if mo.nnz == 0:
        return None, None
    if mo.nonfinite:
        return math.nan, math.nan
    mean, var = mo.mean_var(unbiased=True)
    if var is None:  # nnz == 1
        var = Fraction(0)
    var = max(var, Fraction(0))
    return mean, math.sqrt(float(var + Fraction(eps)))


def masked_whiten(values, mask, shift_mean: bool = True, *, eps: float = WHITEN_EPS, moments=None) -> np.ndarray:
    """Whiten the unmasked entries of ``values [B, T]`` with statistics over the whole batch.

    out = (x − μ) / sqrt(σ² + eps)            (shift_mean=True)
    out = (x − μ) / sqrt(σ² + eps) + μ        (shift_mean=False)
    at unmasked positions; 0.0 at masked positions. μ = Σx/nnz and σ² = Σ(x − μ)²/(nnz − 1) (unbiased)
    over the unmasked entries — or over the global statistics ``moments`` (``ExactMoments``,
    ``reductions.Moments`` or ``ChanMoments`` merged over DP ranks) when given; then ``values`` may be
    one rank's rows only. eps = 1e-8 as in verl and SkyRL.

    Inputs: values (any real dtype, NumPy or torch; any shape actually), mask of the same shape (bool
    or 0/1). Returns float64, the shape of values. Masked entries are ignored whatever they hold
    (NaN, ±inf, 1e30).

    Degenerate cases (defined here; verl and SkyRL raise ValueError from ``masked_var`` for both):
      nnz = 0: every position is masked, so the result is all zeros.
      nnz = 1: the unbiased variance is undefined (0/0); σ² := 0, so the single entry becomes
        (x − x)/sqrt(eps) = 0 (shift_mean=True) or x (shift_mean=False). Justification: with one entry
        x − μ = 0 exactly, so any finite scale gives 0; σ² = 0 is also what a constant batch gives
        (σ² = 0 exactly: out = 0), so a one-token batch behaves like a constant batch.
      a non-finite unmasked entry: every unmasked output is NaN (the batch statistics are NaN).
    Engines differ from this, on purpose here: verl's μ is Σx/(nnz + 1e-8) (a relative bias of
    1e-8/nnz: a constant batch whitens to x·1e-4/nnz instead of 0 in float64); SkyRL's μ is Σx·m/nnz
    (NaN/inf at a masked position poisons everything); both leave (x − μ)·rsqrt(σ² + 1e-8) at masked
    positions instead of 0.

    Accuracy: μ and σ² are exact rationals; sqrt(σ² + eps) is within 1 ulp; x − μ is computed in
    double-double and divided once, so each output is within about 2 ulps of the exact value.
    Raises ValueError (shapes, mask), TypeError (dtype or moments type).
    """
    v = as_float64(values, "values")
    m = as_mask(mask, v.shape)
    mo = exact_moments(v, m) if moments is None else _as_exact(moments)
    out = np.zeros(v.shape)
    if not m.any():
        return out
    if mo.nnz == 0:
        raise ValueError("masked_whiten: global moments have nnz = 0 but values has unmasked entries")
    mean, scale = whiten_scale(mo, eps)
    sel = v[m]
    if isinstance(mean, float) or not np.isfinite(sel).all():  # nan statistics or a local non-finite entry
        out[m] = np.nan
        return out
    mh = float(mean)
    ml = float(mean - Fraction(mh))
    d, e = two_sum(sel, -mh)  # x − μ = d + (e − ml), the pair exact but for the rounding of ml
    dev = d + (e - ml)
    res = dev / scale
    if not shift_mean:
        res = res + mh
    out[m] = res
    return out

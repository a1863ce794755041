"""Exact masked reductions over tokens, and mergeable partial moments.

Inputs: ``values [B, T]`` (any real dtype, NumPy array, torch tensor or anything ``np.asarray`` takes;
any shape actually, as long as ``mask`` has the same) and ``mask [B, T]`` (bool or 0/1; any other value
raises ``ValueError``). Masked-out positions are ignored entirely, whatever they hold (NaN included);
an unmasked NaN or ±inf raises ``ValueError`` (the reference is defined on finite data). Results are
Python ``float`` / ``int``. torch is never imported: tensors are converted with
``t.detach().cpu().double()``.

Empty selection (nnz = 0): ``masked_sum`` is 0.0 and ``masked_count`` 0; mean, var, std, min and max
are undefined and return ``float('nan')``. The unbiased variance (and std) with nnz = 1 is ``nan``.

Accuracy: sums are exactly rounded (``math.fsum``); the mean is fsum / nnz (≤ 1 ulp); the variance is
the corrected two-pass formula Σ(x − μ̂)² − (Σ(x − μ̂))²/n with fsum (Björck; Chan, Golub & LeVeque
1983, "Algorithms for computing the sample variance"), accurate to a few ulps relative even under
catastrophic cancellation (values like 1e16 + small). Moments are merged with fsum (sums and counts)
or with Chan et al.'s pairwise update (1979, "Updating formulae and a pairwise algorithm for
computing sample variances"), the latter evaluated in exact rational arithmetic.

Source: the sum/count metric fix of SkyRL issue #1822: reduce (Σx, Σx², nnz), divide once.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Iterable, NamedTuple

import numpy as np

from ._convert import as_float64, as_mask
from .exact_sum import exact_sum

__all__ = [
    "masked_sum",
    "masked_count",
    "masked_mean",
    "masked_var",
    "masked_std",
    "masked_min",
    "masked_max",
    "Moments",
    "moments",
    "merge_moments",
    "moments_to_mean_var",
    "ChanMoments",
    "chan_moments",
    "chan_merge",
]


def _selected(values, mask) -> np.ndarray:
    """The unmasked values as a 1-D float64 array (row-major order); validates shapes and finiteness."""
    v = as_float64(values, "values")
    m = as_mask(mask, v.shape)
    sel = v[m]
    if not np.isfinite(sel).all():
        pos = tuple(int(i) for i in np.argwhere(m & ~np.isfinite(v))[0])
        raise ValueError(f"values has a non-finite unmasked entry {v[pos]!r} at {pos}")
    return sel


def masked_sum(values, mask) -> float:
    """Σ values·mask, exactly rounded (``math.fsum``). values, mask: ``[B, T]``. Empty → 0.0.

    Raises ValueError: shape mismatch, non-0/1 mask, non-finite unmasked value.
    """
    return exact_sum(_selected(values, mask).tolist())


def masked_count(values_or_mask, mask=None) -> int:
    """nnz = number of unmasked entries, as an ``int``.

    Call as ``masked_count(mask)`` (the catalog form) or ``masked_count(values, mask)``.
    Raises ValueError for a non-0/1 mask (or a mask whose shape differs from values).
    """
    if mask is None:
        return int(np.count_nonzero(as_mask(values_or_mask, None)))
    return int(_selected(values_or_mask, mask).size)


def masked_mean(values, mask) -> float:
    """Σ values·mask / nnz (fsum, then one division: ≤ 1 ulp). nnz = 0 → nan. Errors as masked_sum."""
    sel = _selected(values, mask)
    if sel.size == 0:
        return math.nan
    return exact_sum(sel.tolist()) / sel.size


def _m2(sel: np.ndarray) -> float:
    """Σ (x − μ)² by the corrected two-pass formula with fsum (≥ 0)."""
    n = sel.size
    mu = exact_sum(sel.tolist()) / n
    dev = sel - mu
    m2 = exact_sum((dev * dev).tolist()) - exact_sum(dev.tolist()) ** 2 / n
    return max(m2, 0.0)


def masked_var(values, mask, unbiased: bool = True) -> float:
    """Variance of the unmasked values: Σ(x − μ)² / (nnz − 1) (unbiased) or / nnz (population).

    Two-pass with fsum and the (Σ(x − μ̂))²/n correction: a few ulps relative. nnz = 0 → nan;
    unbiased with nnz = 1 → nan. Errors as masked_sum.
    """
    sel = _selected(values, mask)
    n = sel.size
    ddof = 1 if unbiased else 0
    if n - ddof <= 0:
        return math.nan
    return _m2(sel) / (n - ddof)


def masked_std(values, mask, unbiased: bool = True) -> float:
    """sqrt(masked_var(values, mask, unbiased)). nnz = 0 (or 1 when unbiased) → nan."""
    return math.sqrt(masked_var(values, mask, unbiased))


def masked_min(values, mask) -> float:
    """Minimum of the unmasked values. nnz = 0 → nan. Errors as masked_sum."""
    sel = _selected(values, mask)
    return float(sel.min()) if sel.size else math.nan


def masked_max(values, mask) -> float:
    """Maximum of the unmasked values. nnz = 0 → nan. Errors as masked_sum."""
    sel = _selected(values, mask)
    return float(sel.max()) if sel.size else math.nan


# --------------------------------------------------------------------------------------------------
# mergeable partials


@dataclasses.dataclass(frozen=True)
class Moments:
    """Partial moments of a shard: ``nnz`` (int), ``sum`` = Σx and ``sumsq`` = Σx² (floats, exactly rounded)."""

    nnz: int
    sum: float
    sumsq: float


def _exact_squares(sel: np.ndarray) -> list:
    """x² as hi + lo pairs (Dekker/Veltkamp), so that fsum of the list is Σx² exactly rounded."""
    with np.errstate(invalid="ignore", over="ignore"):
        hi = sel * sel
        split = sel * 134217729.0  # 2**27 + 1
        xh = split - (split - sel)
        xl = sel - xh
        lo = ((xh * xh - hi) + 2.0 * xh * xl) + xl * xl
    lo[~np.isfinite(lo)] = 0.0  # |x| near the overflow threshold: hi is inf anyway
    return hi.tolist() + lo.tolist()


def moments(values, mask) -> Moments:
    """(nnz, Σx, Σx²) over the unmasked values, each sum exactly rounded (x² split exactly before fsum).

    Errors as masked_sum.
    """
    sel = _selected(values, mask)
    return Moments(int(sel.size), exact_sum(sel.tolist()), exact_sum(_exact_squares(sel)))


def _as_moments(p) -> Moments:
    if isinstance(p, Moments):
        return p
    if isinstance(p, dict):
        return Moments(int(p["nnz"]), float(p["sum"]), float(p["sumsq"]))
    nnz, s, ss = p
    return Moments(int(nnz), float(s), float(ss))


def merge_moments(parts: Iterable) -> Moments:
    """Merge partial moments: counts added, sums and sums of squares added with fsum.

    parts: iterable of ``Moments`` (or ``(nnz, sum, sumsq)`` tuples / dicts with those keys).
    The merged sums are the exactly rounded sums of the (already rounded) partial sums. An empty
    iterable gives ``Moments(0, 0.0, 0.0)``.
    """
    ps = [_as_moments(p) for p in parts]
    return Moments(sum(p.nnz for p in ps), exact_sum(p.sum for p in ps), exact_sum(p.sumsq for p in ps))


def moments_to_mean_var(m, unbiased: bool = True) -> tuple:
    """(mean, var) from ``Moments``: mean = Σx/n, var = (Σx² − (Σx)²/n)/(n − ddof).

    Evaluated in exact rational arithmetic from the given floats, clamped at 0, rounded once; so the
    only error left is that of the moments themselves (|Δvar| ≲ eps·Σx²/n: the textbook formula is
    ill-conditioned when |mean| ≫ std — use ``chan_merge`` where that matters). nnz = 0 → (nan, nan);
    unbiased with nnz = 1 → (mean, nan). Raises ValueError for non-finite sums or negative nnz.
    """
    m = _as_moments(m)
    if m.nnz < 0:
        raise ValueError(f"negative nnz {m.nnz}")
    if m.nnz == 0:
        return math.nan, math.nan
    if not (math.isfinite(m.sum) and math.isfinite(m.sumsq)):
        raise ValueError(f"non-finite moments {m}")
    n = m.nnz
    s = Fraction(m.sum)
    mean = float(s / n)
    ddof = 1 if unbiased else 0
    if n - ddof <= 0:
        return mean, math.nan
    m2 = Fraction(m.sumsq) - s * s / n
    return mean, float(max(m2, Fraction(0)) / (n - ddof))


class ChanMoments(NamedTuple):
    """(n, mean, M2) with M2 = Σ(x − mean)²; var = M2/n (population) or M2/(n − 1). Empty: (0, 0.0, 0.0)."""

    n: int
    mean: float
    m2: float


def chan_moments(values, mask) -> ChanMoments:
    """(nnz, mean, M2) of the unmasked values (mean = fsum/n, M2 by corrected two-pass). Empty → (0, 0.0, 0.0)."""
    sel = _selected(values, mask)
    n = int(sel.size)
    if n == 0:
        return ChanMoments(0, 0.0, 0.0)
    return ChanMoments(n, exact_sum(sel.tolist()) / n, _m2(sel))


def chan_merge(a, b) -> ChanMoments:
    """Merge two (n, mean, M2) triples (Chan, Golub & LeVeque 1979, parallel variance):

        n = n_a + n_b,  δ = mean_b − mean_a,  mean = mean_a + δ·n_b/n,  M2 = M2_a + M2_b + δ²·n_a·n_b/n.

    Evaluated exactly in rational arithmetic and rounded once. A part with n = 0 is the identity.
    Raises ValueError for negative counts or non-finite means/M2.
    """
    a = ChanMoments(int(a[0]), float(a[1]), float(a[2]))
    b = ChanMoments(int(b[0]), float(b[1]), float(b[2]))
    if a.n < 0 or b.n < 0:
        raise ValueError(f"negative count in chan_merge({a}, {b})")
    if a.n == 0:
        return b
    if b.n == 0:
        return a
    for v in (a.mean, a.m2, b.mean, b.m2):
        if not math.isfinite(v):
            raise ValueError(f"non-finite moment in chan_merge({a}, {b})")
    n = a.n + b.n
    ma, mb = Fraction(a.mean), Fraction(b.mean)
    delta = mb - ma
    mean = ma + delta * b.n / n
    m2 = Fraction(a.m2) + Fraction(b.m2) + delta * delta * a.n * b.n / n
    return ChanMoments(n, float(mean), float(m2))

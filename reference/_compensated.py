"""Error-free transformations and compensated sums on float64 NumPy arrays (private).

``two_sum`` is Knuth's TwoSum (a + b = s + e exactly, no branch on magnitudes). The sums below carry
the rounding error of every addition in a second array and add it back once at the end ("Sum2" of
Ogita, Rump & Oishi 2005, SIAM J. Sci. Comput. 26(6), arranged as a pairwise tree so that it vectorises
over rows). Their result is as accurate as if computed in twice the working precision and then
rounded: |err| <= eps·|S| + O(n·eps²)·Σ|x_i|; for non-negative terms that is within about one ulp.
"""

from __future__ import annotations

import numpy as np


def two_sum(a, b):
    """Return ``(s, e)`` with ``s = fl(a + b)`` and ``a + b = s + e`` exactly (finite inputs)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def sum_lastdim(x: np.ndarray) -> np.ndarray:
    """Compensated sum of a float64 array ``[R, n]`` over its last axis; returns ``[R]`` float64.

    Pairwise over contiguous halves: at each level ``s = x[:, :h] + x[:, h:2h]`` with its TwoSum errors
    accumulated per row; an odd leftover column is folded in with TwoSum as well. Extra memory: about
    1.5 arrays of half the input. The input is not modified. ``n == 0`` gives zeros.
    """
    rows, n = x.shape
    if n == 0:
        return np.zeros(rows)
    err = np.zeros(rows)
    carries = []
    while n > 1:
        if n & 1:
            carries.append(x[:, n - 1].copy())
            n -= 1
        h = n // 2
        a = x[:, :h]
        b = x[:, h:n]
        s = a + b
        bb = s - a
        t = s - bb
        np.subtract(a, t, out=t)
        np.subtract(b, bb, out=bb)
        t += bb
        del bb
        err += t.sum(axis=1)
        del t
        x = s
        n = h
    total = x[:, 0].copy()
    for c in carries:
        total, e = two_sum(total, c)
        err += e
    return total + err


def cumsum_lastdim(x: np.ndarray, reverse: bool = False) -> np.ndarray:
    """Compensated cumulative sum of float64 ``[R, n]`` along the last axis (Neumaier-style carry).

    Each output element is the running sum computed as ``s + c`` with ``c`` the accumulated TwoSum errors,
    so every prefix sum is accurate to about one ulp of the prefix's Σ|x|·eps² beyond its own rounding.
    ``reverse=True`` gives suffix sums (out[:, t] = Σ_{j >= t} x[:, j]).
    """
    x = np.asarray(x, dtype=np.float64)
    rows, n = x.shape
    out = np.empty((rows, n))
    s = np.zeros(rows)
    c = np.zeros(rows)
    cols = range(n - 1, -1, -1) if reverse else range(n)
    for j in cols:
        s, e = two_sum(s, x[:, j])
        c += e
        out[:, j] = s + c
    return out

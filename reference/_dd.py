"""Double-double ("dd") arithmetic on float64 NumPy arrays (private).

A dd number is a pair ``(hi, lo)`` of float64 arrays with ``|lo| <= ulp(hi)/2``; it carries about 106
bits. The algorithms are the error-free transformations TwoSum (Knuth), FastTwoSum (Dekker) and
TwoProduct via Veltkamp splitting (Dekker 1971, "A floating-point technique for extending the
available precision"), combined as in the QD library's "accurate" add and multiply (Hida, Li &
Bailey 2001). Relative error of one dd add or multiply: a few units of 2**-104.

Limits: finite inputs with |x| <= 2**995 (Veltkamp's split multiplies by 2**27 + 1) and products that
neither overflow nor underflow; callers replace non-finite entries before calling.
"""

from __future__ import annotations

from ._compensated import two_sum

_SPLIT = 134217729.0  # 2**27 + 1

def fast_two_sum(a, b):
    """``(s, e)`` with ``s = fl(a + b)`` and ``a + b = s + e`` exactly, given ``|a| >= |b|`` (or a = 0)."""
    s = a + b
    e = b - (s - a)
    return s, e

def split(a):
    """Veltkamp split: ``a = hi + lo`` exactly, each half with at most 26 significant bits."""
    c = _SPLIT * a
    hi = c - (c - a)
    return hi, a - hi

def two_prod(a, b):
    """``(p, e)`` with ``p = fl(a·b)`` and ``a·b = p + e`` exactly (no overflow or underflow)."""
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e

def dd_add(ah, al, bh, bl):
    """(ah + al) + (bh + bl) as a normalised dd pair."""
    s, e = two_sum(ah, bh)
    t, f = two_sum(al, bl)
    e = e + t
    s, e = fast_two_sum(s, e)
    e = e + f
    return fast_two_sum(s, e)

def dd_mul(ah, al, bh, bl):
    """(ah + al)·(bh + bl) as a normalised dd pair (the al·bl term, below 2**-106 relative, is dropped)."""
    p, e = two_prod(ah, bh)
    e = e + (ah * bl + al * bh)
    return fast_two_sum(p, e)

def dd_round(hi, lo):
    """The float64 nearest to hi + lo (hi + lo rounded once; exact when the pair is normalised)."""
    return hi + lo

"""Σ of floats, exactly rounded, that never raises on non-finite or overflowing terms.

``math.fsum`` is exactly rounded, but raises ``ValueError`` on ``inf + -inf`` and ``OverflowError`` when
finite terms sum past the float64 range. An engine's output is data to judge, whatever it holds: the sums
that combine or compare it follow IEEE 754 instead (a NaN term or both infinities: NaN; one infinity: that
infinity; an exact sum past the range: the infinity of its sign).
"""

from __future__ import annotations

import math
from typing import Iterable

__all__ = ["exact_sum"]

#: scale that brings any finite float64 sum back into range (for its sign only)
_SHRINK = 2.0 ** -64


def exact_sum(values: Iterable[float]) -> float:
    """Σ ``values`` exactly rounded to float64 (``math.fsum``), with IEEE 754 results where ``fsum`` raises.

    values: an iterable of Python / NumPy floats (any length; empty → 0.0). Returns a float; never raises
    on NaN, ±inf or overflow (see the module docstring). Raises ``TypeError`` on a term that is not a
    real number, as ``math.fsum`` does."""
    terms = values if isinstance(values, (list, tuple)) else list(values)
    try:
        return math.fsum(terms)
    except (ValueError, OverflowError):
        pass
    floats = [float(t) for t in terms]
    if any(math.isnan(t) for t in floats):
        return math.nan
    pos, neg = any(t == math.inf for t in floats), any(t == -math.inf for t in floats)
    if pos and neg:
        return math.nan
    if pos or neg:
        return math.inf if pos else -math.inf
    return math.copysign(math.inf, math.fsum(t * _SHRINK for t in floats))  # finite terms past the range

"""The value a metric pipeline must report: token-weighted statistics over a whole global batch."""

from __future__ import annotations

import math

import numpy as np

from .exact_sum import exact_sum
from .reductions import masked_count, masked_max, masked_mean, masked_min, masked_std

__all__ = ["INTEGER_STATISTICS", "metric_statistics", "token_metrics"]


def token_metrics(values, mask) -> dict:
    """Token-weighted statistics over all unmasked tokens of a global batch.

    values: ``[B, T]`` (any real dtype, NumPy or torch); mask: ``[B, T]`` bool or 0/1.
    Returns ``{"mean": float, "std": float, "min": float, "max": float, "nnz": int}`` where std is the
    *population* standard deviation (Σ(x − μ)²/nnz)^½. With nnz = 0, mean/std/min/max are nan.

    This is what a metric pipeline (emit per micro-batch → reduce micro-batches → all-reduce DP →
    finalize) must report for every way the batch is split: each token weighs the same, so a
    shard's mean is never averaged with another's (the "mean of per-shard means" bug: shard A =
    1 token at 1.0, shard B = 100 tokens at 2.0 → 201/101, not 1.5).
    Raises ValueError as :func:`rlconform.reference.masked_mean`.
    Source: SkyRL issue #1822 and its sum/count fix (SkyRL issue #1822).
    """
    return {
        "mean": masked_mean(values, mask),
        "std": masked_std(values, mask, unbiased=False),
        "min": masked_min(values, mask),
        "max": masked_max(values, mask),
        "nnz": masked_count(values, mask),
    }


#: the statistics :func:`metric_statistics` returns whose values are integers (compared exactly)
INTEGER_STATISTICS = ("count", "len_min", "len_max", "n_seq")


def metric_statistics(values, mask, multiplicity=None) -> dict:
    """Every statistic a trainer logs of one token-level quantity over a global batch.

    values: ``[B, T]`` real (NumPy or torch, converted exactly to float64); mask: ``[B, T]`` bool or 0/1;
    multiplicity: optional ``[B, T]`` non-negative ints, the run-length form: entry (b, t) stands for
    ``multiplicity[b, t]`` identical tokens of row b (so a batch of 2²⁴ tokens needs no 2²⁴-element array);
    default 1 everywhere. Row b is one sequence; its length L_b = Σ_t mask·multiplicity.

    Returns ``{"mean", "min", "max", "sum", "count", "len_mean", "len_min", "len_max", "n_seq"}``:

    * token statistics over every unmasked token: mean = Σx / count (fsum, one division), min, max,
      sum = Σx (fsum: exactly rounded), count = number of unmasked tokens (``int``, exact at any size);
    * per-sequence statistics of the sequence lengths L_b over all B rows (a row with no unmasked token
      is a sequence of length 0): len_mean = Σ L_b / B, len_min, len_max (``int``), n_seq = B (``int``).

    With count = 0, mean / min / max are nan and sum is 0.0. The integer statistics
    (:data:`INTEGER_STATISTICS`) are Python ints: a reducer that carries them in float32 (exact only up to
    2²⁴ = 16 777 216) is wrong by a whole token above that.
    Raises ValueError for mismatched shapes, a non-0/1 mask or a negative multiplicity.
    Source: what verl ``reduce_metrics`` / ``Metric`` (MEAN, SUM, MIN, MAX) and SkyRL ``reduce_metrics`` /
    ``all_reduce_metrics`` (mean, ``_min``, ``_max``, ``_loss`` sums) are meant to produce for one
    optimizer step.
    """
    v = np.asarray(values.detach().cpu().double() if hasattr(values, "detach") else values, dtype=np.float64)
    m = np.asarray(mask.detach().cpu() if hasattr(mask, "detach") else mask)
    if v.ndim != 2 or m.shape != v.shape:
        raise ValueError(f"values and mask must be [B, T] of one shape, got {v.shape} and {m.shape}")
    if not np.isin(m, (0, 1)).all():
        raise ValueError("mask must be 0/1 (or bool)")
    m = m.astype(bool)
    k = np.ones(v.shape, np.int64) if multiplicity is None else np.asarray(multiplicity)
    if k.shape != v.shape or (k < 0).any():
        raise ValueError(f"multiplicity must be non-negative ints of shape {v.shape}")
    k = np.where(m, k.astype(np.int64), 0)
    lengths = [int(x) for x in k.sum(axis=1)]
    count = sum(lengths)
    sel = k > 0
    total = exact_sum((v[sel] * k[sel]).tolist())  # v has ≤ 53 bits, k < 2^31: exact products for fp32 v
    out = {
        "sum": total,
        "count": count,
        "mean": total / count if count else math.nan,
        "min": float(v[sel].min()) if count else math.nan,
        "max": float(v[sel].max()) if count else math.nan,
        "n_seq": v.shape[0],
        "len_min": min(lengths),
        "len_max": max(lengths),
    }
    out["len_mean"] = exact_sum(lengths) / v.shape[0]
    return out

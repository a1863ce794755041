"""The value a metric pipeline must report: token-weighted statistics over a whole global batch."""

from __future__ import annotations

from .reductions import masked_count, masked_max, masked_mean, masked_min, masked_std

__all__ = ["token_metrics"]


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
    Source: SkyRL issue #1822 and its sum/count fix (seed 000).
    """
    return {
        "mean": masked_mean(values, mask),
        "std": masked_std(values, mask, unbiased=False),
        "min": masked_min(values, mask),
        "max": masked_max(values, mask),
        "nnz": masked_count(values, mask),
    }

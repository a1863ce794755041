"""The value a metric pipeline must report: token-weighted statistics over a whole global batch."""

from __future__ import annotations

import math

import numpy as np

from .exact_sum import exact_sum
from .reductions import masked_count, masked_max, masked_mean, masked_min, masked_std, masked_var

__all__ = ["BATCH_STATISTICS", "CRITIC_STATISTICS", "INTEGER_STATISTICS", "batch_metrics", "metric_statistics",
           "token_metrics"]


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


#: the statistics :func:`batch_metrics` returns for every batch
BATCH_STATISTICS = (
    "score_mean", "score_max", "score_min", "reward_mean", "reward_max", "reward_min",
    "advantages_mean", "advantages_max", "advantages_min", "returns_mean", "returns_max", "returns_min",
    "response_length_mean", "response_length_max", "response_length_min", "response_length_clip_ratio",
    "non_aborted_length_mean", "non_aborted_length_max", "non_aborted_length_min", "non_aborted_length_clip_ratio",
    "aborted_ratio", "prompt_length_mean", "prompt_length_max", "prompt_length_min", "prompt_length_clip_ratio",
)
#: the statistics it adds when the batch has a critic's values
CRITIC_STATISTICS = ("values_mean", "values_max", "values_min", "vf_explained_var")


def _stats(prefix: str, x: np.ndarray) -> dict:
    """mean (fsum, one division) / max / min of ``x`` (1-D float64); nan when empty."""
    if x.size == 0:
        return {f"{prefix}_mean": math.nan, f"{prefix}_max": math.nan, f"{prefix}_min": math.nan}
    return {f"{prefix}_mean": exact_sum(x.tolist()) / x.size, f"{prefix}_max": float(x.max()),
            f"{prefix}_min": float(x.min())}


def _lengths(prefix: str, lengths: np.ndarray, width: int) -> dict:
    out = _stats(prefix, lengths.astype(np.float64))
    out[f"{prefix}_clip_ratio"] = float(np.mean(lengths == width)) if lengths.size else math.nan
    return out


def batch_metrics(token_level_scores, token_level_rewards, advantages, returns, response_mask, attention_mask,
                  values=None, explained_var_eps: float = 1e-5) -> dict:
    """The statistics a PPO trainer logs of one training batch (verl ``metric_utils.compute_data_metrics``).

    token_level_scores, token_level_rewards, advantages, returns, values: ``[B, R]`` real (NumPy or torch,
    converted exactly to float64); response_mask: ``[B, R]`` 0/1, the tokens the loss trains on; attention_mask:
    ``[B, P + R]`` 0/1 over the prompt then the response (its last R columns are the response's). Row b's
    response length is its number of attention-mask ones in the response (observation tokens count); a row of
    response length 0 is *aborted*.

    Returns :data:`BATCH_STATISTICS` (and :data:`CRITIC_STATISTICS` with ``values``), floats:

    * ``score_*`` / ``reward_*``: mean / max / min over the non-aborted rows of the row sums Σ_t of the token scores
      / rewards (fsum);
    * ``advantages_*``, ``returns_*``, ``values_*``: mean / max / min over the response-mask tokens;
    * ``response_length_*``: mean / max / min over all rows, ``clip_ratio`` the fraction of rows whose response
      fills all R columns; ``non_aborted_length_*`` the same over the non-aborted rows; ``aborted_ratio`` the
      fraction of aborted rows; ``prompt_length_*`` (clip ratio: prompts filling all P columns);
    * ``vf_explained_var`` = 1 − Var(returns − values) / (Var(returns) + ``explained_var_eps``) over the
      response-mask tokens, Var the unbiased variance (verl's stabiliser 1e-5 by default).

    A statistic of an empty selection (every row aborted, no response-mask token, fewer than two tokens for
    the variance) is nan: undefined, and a trainer must still log the batch (raising there kills the run).
    Raises ValueError for inconsistent shapes or a non-0/1 mask.
    Source: verl ``compute_data_metrics`` (trainer/ppo/metric_utils.py), which raised on an all-aborted batch and
    on a batch without a response-mask token (``torch.max`` of an empty selection) before its empty-selection
    guards (verl PR #5899).
    """
    def arr(x):
        return np.asarray(x.detach().cpu().double() if hasattr(x, "detach") else x, dtype=np.float64)

    scores, rewards, adv, ret = arr(token_level_scores), arr(token_level_rewards), arr(advantages), arr(returns)
    m, att = arr(response_mask), arr(attention_mask)
    if m.ndim != 2 or any(x.shape != m.shape for x in (scores, rewards, adv, ret)):
        raise ValueError(f"token tensors must be [B, R] of one shape, got {[x.shape for x in (scores, adv, m)]}")
    width = m.shape[1]
    if att.ndim != 2 or att.shape[0] != m.shape[0] or att.shape[1] < width:
        raise ValueError(f"attention_mask must be [B, P + R] with R = {width}, got {att.shape}")
    if not (np.isin(m, (0, 1)).all() and np.isin(att, (0, 1)).all()):
        raise ValueError("masks must be 0/1 (or bool)")
    m = m.astype(bool)
    response_length = att[:, att.shape[1] - width:].sum(1).astype(np.int64)
    prompt_length = att[:, :att.shape[1] - width].sum(1).astype(np.int64)
    kept = response_length > 0
    out = {}
    out.update(_stats("score", np.array([exact_sum(r.tolist()) for r in scores[kept]])))
    out.update(_stats("reward", np.array([exact_sum(r.tolist()) for r in rewards[kept]])))
    out.update(_stats("advantages", adv[m]))
    out.update(_stats("returns", ret[m]))
    out.update(_lengths("response_length", response_length, width))
    out.update(_lengths("non_aborted_length", response_length[kept], width))
    out["aborted_ratio"] = float(np.mean(~kept))
    out.update(_lengths("prompt_length", prompt_length, att.shape[1] - width))
    if values is not None:
        val = arr(values)
        if val.shape != m.shape:
            raise ValueError(f"values must be {m.shape}, got {val.shape}")
        out.update(_stats("values", val[m]))
        n = int(m.sum())
        out["vf_explained_var"] = (1.0 - masked_var(ret - val, m, unbiased=True) /
                                   (masked_var(ret, m, unbiased=True) + explained_var_eps)) if n >= 2 else math.nan
    return {k: out[k] for k in BATCH_STATISTICS + (CRITIC_STATISTICS if values is not None else ())}

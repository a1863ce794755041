"""Label-smoothed token log-probabilities (the negative of a label-smoothed cross-entropy) and their
gradient, float64.

With label smoothing α the target distribution puts 1 − α on the label and α uniformly on all V
classes (PyTorch's ``F.cross_entropy(label_smoothing=α)`` convention); the smoothed log-probability is
minus the cross-entropy against it:

    s(x, y; α) = (1 − α)·log p_y + α·(1/V)·Σ_v log p_v = (1 − α)·x_y + α·mean(x) − logsumexp(x)

Megatron-core's ``vocab_parallel_cross_entropy(logits, target, label_smoothing=α_M)`` spreads the mass
over the V − 1 other classes instead (NeMo's convention): its loss is −s(x, y; α) with
α = α_M·V/(V − 1). Under tensor parallelism V is the *whole* vocab and the mean runs over every
shard — a per-shard V and a per-shard mean (Megatron-core 0.19.2 ``_VocabParallelCrossEntropy.forward``
uses ``exp_logits.size(-1)``, the partition's vocab, and ``log_probs.mean(dim=-1)`` over the local
shard) give each TP rank a different, wrong loss.

α = 0 is ``token_logprobs``. ``-inf`` logits (a padded vocab) make mean(x) = −inf, so s = −inf: a
padded vocab must not be smoothed over (the regimes of the smoothed ops have finite logits).
"""

from __future__ import annotations

import numpy as np

from ._convert import as_float64
from .exact_sum import exact_sum
from .softmax_stats import logsumexp_grad, token_logprobs

__all__ = ["smoothed_token_logprobs", "smoothed_token_logprobs_grad"]


def _alpha(label_smoothing) -> float:
    a = float(label_smoothing)
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {a!r}")
    return a


def _mean_logp(x: np.ndarray) -> np.ndarray:
    """mean_v log p_v = mean_v(x_v − m) − log1p(Σ_{v≠argmax} exp(x_v − m)) per row (m = the row max):
    both terms O(log V) and formed from x − m (exact near the max), sums exactly rounded (exact_sum)."""
    x2 = x.reshape(-1, x.shape[-1])
    j = x2.argmax(axis=-1)
    rows = np.arange(x2.shape[0])
    d = x2 - x2[rows, j][:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(d)
    e[rows, j] = 0.0
    mean_d = np.array([exact_sum(r) for r in d]) / x.shape[-1]
    lse_minus_m = np.log1p(np.array([exact_sum(r) for r in e]))
    return (mean_d - lse_minus_m).reshape(x.shape[:-1])


def smoothed_token_logprobs(logits, labels, label_smoothing) -> np.ndarray:
    """(1 − α)·log p_y + α·mean_v log p_v: minus the label-smoothed cross-entropy of each token.

    logits: ``[..., V]`` (any real dtype, NumPy or torch); labels: integer ``[...]`` in ``[0, V)``;
    label_smoothing α: float in [0, 1] (PyTorch's convention: α spread over all V classes). Returns
    float64 ``[...]`` (nats, ≤ 0). Formula: (1 − α)·log p_y + α·(mean_v(x_v − m) − log1p(Σ_{v≠argmax} e^{x_v − m})), m
    the row max, with log p_y from :func:`token_logprobs` (a few ulps) and the mean term from an exactly
    rounded sum: accurate to a few ulps of max(|log p_y|, |mean log p|). ``-inf`` in a row gives −inf
    when α > 0. Raises ValueError: α outside [0, 1], and as ``token_logprobs`` (NaN, +inf, bad labels).
    Source: PyTorch ``F.cross_entropy(label_smoothing=α)``; Megatron-core ``vocab_parallel_cross_entropy``
    with α_M = α·(V − 1)/V (see the module doc).
    """
    a = _alpha(label_smoothing)
    tlp = token_logprobs(logits, labels)
    if a == 0.0:
        return tlp
    mean_logp = _mean_logp(as_float64(logits, "logits"))
    with np.errstate(invalid="ignore"):
        return (1.0 - a) * tlp + a * mean_logp


def smoothed_token_logprobs_grad(logits, labels, label_smoothing, grad_output=None) -> np.ndarray:
    """d s / d logits = (1 − α)·onehot(y) + α/V − p, times ``grad_output[..., None]``.

    logits: ``[..., V]``; labels: integer ``[...]``; α in [0, 1]; grad_output: ``[...]`` (default ones).
    Returns float64 ``[..., V]``. At the label the term (1 − α) − p_y + α/V is formed as
    (1 − α)·(1 − p_y) + α·(1/V − p_y) with 1 − p_y = Σ_{v≠y} p_v, accurate for p_y → 1. Raises ValueError
    as :func:`smoothed_token_logprobs`. Source: differentiate the formula above.
    """
    a = _alpha(label_smoothing)
    x = as_float64(logits, "logits")
    v = x.shape[-1]
    p = logsumexp_grad(x)  # softmax
    lab = np.asarray(labels).astype(np.int64)
    token_logprobs(x, lab)  # validates labels (shape, range) the way token_logprobs does
    out = a / v - p
    p2 = p.reshape(-1, v)
    o2 = out.reshape(-1, v)
    rows = np.arange(p2.shape[0])
    l1 = lab.reshape(-1)
    at_label = np.zeros(p2.shape, bool)
    at_label[rows, l1] = True
    others = np.where(at_label, 0.0, p2).sum(axis=-1)  # Σ_{v≠y} p_v (= 1 − p_y without cancellation)
    o2[rows, l1] = (1.0 - a) * others + a * (1.0 / v - p2[rows, l1])
    if grad_output is not None:
        g = np.broadcast_to(np.asarray(grad_output, dtype=np.float64), x.shape[:-1])
        out = out * g[..., None]
    return out

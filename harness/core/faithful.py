"""Dtype-faithful stable computations in torch: the yardstick of the tolerance policy.

Each function upcasts its input to float32 (float64 stays float64), computes with the stable formula
and rounds the result to the input's dtype. ``|faithful − reference|`` measures how hard an input is
for a correct implementation in that dtype; the tolerance policy (:mod:`rlconform.harness.core.tolerance`)
allows an engine a constant multiple of it. These functions never write into their inputs and are
differentiable, so they double as the ``reference`` engine (:mod:`rlconform.harness.bindings.reference`).

Shapes follow the catalog (:mod:`rlconform.harness.catalog.ops`). ``-inf`` logits are masked vocab
entries (p = 0, 0·log 0 = 0).
"""

from __future__ import annotations

import torch

__all__ = [
    "agg_loss_micro", "compute_dtype", "entropy", "fused_linear_token_stats", "logsumexp", "masked_count", "masked_max", "masked_mean",
    "masked_min", "masked_std", "masked_sum", "masked_var", "optimal_token_baseline", "smoothed_token_logprobs",
    "sum_pi_squared", "token_logprobs",
]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 input, float32 for every other float dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _up(x: torch.Tensor) -> torch.Tensor:
    return x.to(compute_dtype(x.dtype))


def logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """log Σ_v exp(logits_v) over the last dim: [..., V] -> [...], dtype of ``logits``."""
    return torch.logsumexp(_up(logits), dim=-1).to(logits.dtype)


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[labels]: [..., V], int [...] -> [...], dtype of ``logits``."""
    logp = torch.log_softmax(_up(logits), dim=-1)
    return logp.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1).to(logits.dtype)


def smoothed_token_logprobs(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """(1 − α)·log p_y + α·mean_v log p_v (minus PyTorch's label-smoothed cross-entropy): [..., V], int
    [...], float -> [...], dtype of ``logits``."""
    logp = torch.log_softmax(_up(logits), dim=-1)
    tlp = logp.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return ((1.0 - label_smoothing) * tlp + label_smoothing * logp.mean(-1)).to(logits.dtype)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = −Σ p log p over the last dim with 0·log 0 = 0: [..., V] -> [...], dtype of ``logits``."""
    logp = torch.log_softmax(_up(logits), dim=-1)
    p = logp.exp()
    safe_logp = torch.where(p > 0, logp, torch.zeros_like(logp))
    return (-(p * safe_logp).sum(-1)).to(logits.dtype)


def sum_pi_squared(logits: torch.Tensor) -> torch.Tensor:
    """Σ_v π_v² with π = softmax(logits): [..., V] -> [...], dtype of ``logits`` (verl PR #6153)."""
    p = torch.softmax(_up(logits), dim=-1)
    return (p * p).sum(-1).to(logits.dtype)


def _masked(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values upcast with every masked position replaced by 0, mask as 0/1 of that dtype): masked
    positions never reach arithmetic, whatever they hold (NaN, ±inf, 1e30: NaN·0 is NaN)."""
    v = _up(values)
    keep = mask != 0
    return torch.where(keep, v, torch.zeros((), dtype=v.dtype)), keep.to(v.dtype)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ values·mask: [B, T], [B, T] -> 0-d, dtype of ``values``."""
    v, m = _masked(values, mask)
    return (v * m).sum().to(values.dtype)


def masked_count(mask: torch.Tensor) -> torch.Tensor:
    """nnz = number of unmasked entries: [B, T] -> 0-d int64."""
    return (mask != 0).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ values·mask / nnz: -> 0-d, NaN when nnz = 0."""
    v, m = _masked(values, mask)
    return ((v * m).sum() / m.sum()).to(values.dtype)


def _masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool) -> torch.Tensor:
    v, m = _masked(values, mask)
    n = m.sum()
    mean = (v * m).sum() / n
    ss = torch.where(m != 0, (v - mean) ** 2, torch.zeros((), dtype=v.dtype)).sum()
    return ss / (n - 1 if unbiased else n)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Two-pass masked variance (unbiased: / (nnz − 1), else / nnz): -> 0-d, NaN when undefined."""
    return _masked_var(values, mask, unbiased).to(values.dtype)


def masked_std(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """sqrt(masked_var), the variance kept in the compute dtype: -> 0-d."""
    return _masked_var(values, mask, unbiased).sqrt().to(values.dtype)


def masked_min(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """min over unmasked entries: -> 0-d, NaN when nnz = 0."""
    v, m = _masked(values, mask)
    if not bool((m != 0).any()):
        return torch.tensor(float("nan"), dtype=values.dtype)
    return v[m != 0].min().to(values.dtype)


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """max over unmasked entries: -> 0-d, NaN when nnz = 0."""
    v, m = _masked(values, mask)
    if not bool((m != 0).any()):
        return torch.tensor(float("nan"), dtype=values.dtype)
    return v[m != 0].max().to(values.dtype)


def agg_loss_micro(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, info) -> torch.Tensor:
    """One micro-batch's contribution to the global-batch loss, normalised by *global* counts.

    Summed over micro-batches and averaged over ``info.dp_size`` ranks it equals the reference
    :func:`rlconform.reference.agg_loss` (the fix of HF transformers PR #34191 / verl's global
    batch info): token-mean = Σ(loss·mask) / global nnz · dp_size, and so on.
    """
    v, m = _masked(loss_mat, mask)
    dp = info.dp_size
    if mode == "token-mean":
        return (v * m).sum() / info.global_nnz * dp
    if mode == "token-sum":
        return (v * m).sum() * dp
    seq_tokens = m.sum(-1)
    seq_sum = (v * m).sum(-1)
    nonempty = seq_tokens > 0
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        out = seq_sum[nonempty].sum() / info.global_nonempty_seqs * dp
        if mode == "seq-mean-token-sum-norm":
            scale = info.loss_scale_factor if info.loss_scale_factor is not None else mask.shape[-1]
            out = out / scale
        return out
    if mode == "seq-mean-token-mean":
        return (seq_sum[nonempty] / seq_tokens[nonempty]).sum() / info.global_nonempty_seqs * dp
    raise ValueError(f"unknown loss_agg_mode {mode!r}")


def optimal_token_baseline(rewards, mask, index, old_log_probs, sum_pi_squared):
    """Optimal token baseline advantages (verl PR #6153) computed in the compute dtype, without epsilon.

    rewards, mask, old_log_probs, sum_pi_squared: [B, T]; index: [B] group ids (array-like).
    w_t = 1 − 2π_t + Σπ², W = cumsum(w·mask); per group of size ≥ 2: B_t = Σ G_t W_t / Σ W_t (0 where
    Σ W_t = 0); the strictly longest trajectory's tail beyond the second longest gets baseline 0.
    Returns (advantages [B, T], returns [B, T]) in the dtype of ``rewards``.
    """
    import numpy as np

    cd = compute_dtype(rewards.dtype)
    m = mask.to(cd)
    keep = m != 0
    zero = torch.zeros((), dtype=cd)
    r, lp, spp = (torch.where(keep, t.to(cd), zero) for t in (rewards, old_log_probs, sum_pi_squared))
    returns = (r * m).flip(-1).cumsum(-1).flip(-1)
    w = 1 - 2 * lp.exp() + spp
    wc = (w * m).cumsum(-1)
    baselines = torch.zeros_like(returns)
    index = np.asarray(index)
    for g in np.unique(index):
        rows = torch.from_numpy(np.flatnonzero(index == g))
        if rows.numel() < 2:
            continue
        num = (returns[rows] * wc[rows] * m[rows]).sum(0)
        den = (wc[rows] * m[rows]).sum(0)
        base = torch.where(den != 0, num / torch.where(den != 0, den, torch.ones_like(den)), torch.zeros_like(den))
        baselines[rows] = base.expand(rows.numel(), -1)
        lengths = m[rows].sum(-1)
        top = torch.sort(lengths).values
        longest, second = int(top[-1]), int(top[-2])
        at_max = torch.nonzero(lengths == longest).reshape(-1)
        if at_max.numel() == 1 and longest > second:
            baselines[rows[int(at_max[0])], second:] = 0
    adv = (returns - baselines) * m
    return adv.to(rewards.dtype), returns.to(rewards.dtype)


def fused_linear_token_stats(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float,
                             chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, entropy) of ``z = hidden @ weightᵀ / temperature``: hidden [..., H], weight [V, H], labels int
    [...] -> two [...] tensors in the compute dtype (float32, float64 for float64 input; the caller rounds them
    to the engine's output dtypes). The logits are formed as a correct implementation in the input dtype
    forms them: the product in the compute dtype, rounded once to the input dtype, then upcast.
    ``chunk_size``: rows per chunk (None: one chunk); the rows are independent, so the chunking changes
    nothing but the memory."""
    cd = compute_dtype(hidden.dtype)
    h2 = hidden.reshape(-1, hidden.shape[-1])
    lab = labels.reshape(-1).long()
    step = chunk_size or max(1, h2.shape[0])
    lps, ents = [], []
    for i in range(0, h2.shape[0], step):
        z = ((h2[i:i + step].to(cd) @ weight.to(cd).T) / temperature).to(hidden.dtype).to(cd)
        logp = torch.log_softmax(z, dim=-1)
        lps.append(logp.gather(-1, lab[i:i + step].unsqueeze(-1)).squeeze(-1))
        p = logp.exp()
        ents.append(-(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1))
    lead = hidden.shape[:-1]
    return torch.cat(lps).reshape(lead), torch.cat(ents).reshape(lead)


def _on_the_run_device() -> None:
    """Every public function of this module computes on the run's device (the faithful path runs
    where the engine runs), its results brought back to the CPU (:func:`rlconform.harness.core.device.faithful_call`)."""
    from rlconform.harness.core.device import faithful_call

    g = globals()
    for name, obj in list(g.items()):
        if callable(obj) and not name.startswith("_") and getattr(obj, "__module__", None) == __name__ \
                and name != "compute_dtype":
            g[name] = faithful_call(obj)


_on_the_run_device()

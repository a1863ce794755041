"""The ``reference`` engine: the dtype-faithful computations of :mod:`rlconform.harness.core.faithful`.

It must pass every property; the self-tests assert so. Its metric pipeline is the sum/count fix of
SkyRL issue #1822, made numerically stable: workers emit masked sums, counts, the sum of
squared deviations from their own mean (M2), min and max; every reduction adds sums and counts and
merges M2 with Chan et al.'s parallel formula (1979), instead of E[x²] − E[x]², which cancels
catastrophically for values with a large offset; the trainer divides once.
"""

from __future__ import annotations

import math

import torch

from rlconform.harness.catalog.binding import AggLoss, Binding, Implementation, MetricPipeline, PolicyStep, Variants
from rlconform.harness.core import faithful as F
from rlconform.harness.families import advantages as A
from rlconform.harness.families import batch_metrics as _bm
from rlconform.harness.families import importance_ratio as _ir
from rlconform.harness.families import kl_estimator as _kl
from rlconform.harness.families import policy_loss as _pl
from rlconform.harness.families import policy_step as _step
from rlconform.harness.families import rejection_mask as _rs
from rlconform.harness.families import value_loss as _vl


def emit_sums(values: torch.Tensor, mask: torch.Tensor) -> dict:
    """Per-micro-batch partials as Python numbers: sum, nnz, M2 (Σ(x − local mean)²), min, max."""
    v = values.detach().double()
    m = mask.detach().to(torch.bool)
    sel = v[m]
    n = int(sel.numel())
    mean = float(sel.mean()) if n else 0.0
    return {
        "x_sum": float(sel.sum()),
        "x_m2": float(((sel - mean) ** 2).sum()),
        "x_nnz": n,
        "x_min": float(sel.min()) if n else math.inf,
        "x_max": float(sel.max()) if n else -math.inf,
    }


def reduce_sums(parts: list[dict]) -> dict:
    """Add sums and counts, Chan-merge M2, take min of mins and max of maxes."""
    n = sum(p["x_nnz"] for p in parts)
    total = math.fsum(p["x_sum"] for p in parts)
    mean = total / n if n else 0.0
    # Chan et al.: M2 = Σ M2_i + Σ n_i (mean_i − mean)²
    m2 = math.fsum([p["x_m2"] for p in parts] + [p["x_nnz"] * (p["x_sum"] / p["x_nnz"] - mean) ** 2
                                                  for p in parts if p["x_nnz"]])
    return {
        "x_sum": total,
        "x_m2": m2,
        "x_nnz": n,
        "x_min": min(p["x_min"] for p in parts),
        "x_max": max(p["x_max"] for p in parts),
    }


def finalize_sums(d: dict) -> dict:
    """Divide once: mean = Σx / n, population std = sqrt(M2 / n)."""
    n = d["x_nnz"]
    out = dict(d)
    if n:
        out["x_mean"] = d["x_sum"] / n
        out["x_std"] = math.sqrt(d["x_m2"] / n)
    return out


sum_count_pipeline = MetricPipeline(
    emit=emit_sums,
    reduce_micro=reduce_sums,
    reduce_dp=reduce_sums,
    finalize=finalize_sums,
    stats={"mean": "x_mean", "std": "x_std", "min": "x_min", "max": "x_max"},
)


# ------------------------------------------------------------------------------ metric statistics
def as_number(x):
    """A logged value as a Python number, whatever type a trainer emitted it as (Python float / int, 0-d
    tensor, NumPy scalar): integers stay ``int`` (exact at any size), floats become ``float``."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"a logged metric must be a scalar, got a tensor of shape {tuple(x.shape)}")
        return x.item()
    if hasattr(x, "item") and not isinstance(x, (int, float)):
        return x.item()  # NumPy scalar
    return x


def emit_statistics(values: torch.Tensor, mask: torch.Tensor) -> dict:
    """Per-micro-batch partials of every statistic: token sum (float64), count (int), min / max over the
    unmasked tokens only (±inf, the identities, for a micro-batch without tokens), and the sequence
    lengths' sum, min, max and number (ints)."""
    m = mask.detach().to(torch.bool)
    v = values.detach()
    lengths = m.sum(-1)
    n = int(lengths.sum())
    return {
        "x_sum": float(torch.where(m, v, 0).sum(dtype=torch.float64)),
        "x_count": n,
        "x_min": float(torch.where(m, v, math.inf).min()) if n else math.inf,
        "x_max": float(torch.where(m, v, -math.inf).max()) if n else -math.inf,
        "len_sum": int(lengths.sum()),
        "len_min": int(lengths.min()),
        "len_max": int(lengths.max()),
        "n_seq": int(m.shape[0]),
    }


def reduce_statistics(parts: list[dict]) -> dict:
    """Sums of sums (``math.fsum`` for floats, exact ``int`` addition for integers), min of mins, max of
    maxes; every value converted by :func:`as_number` first, so no value type is dropped."""
    keys = {k for p in parts for k in p}
    out = {}
    for k in sorted(keys):
        vals = [as_number(p[k]) for p in parts if k in p]
        if k.endswith("_min"):
            out[k] = min(vals)
        elif k.endswith("_max"):
            out[k] = max(vals)
        elif all(isinstance(x, int) for x in vals):
            out[k] = sum(vals)
        else:
            out[k] = math.fsum(vals)
    return out


def finalize_statistics(d: dict) -> dict:
    """Divide once: x_mean = Σx / count, len_mean = Σ lengths / n_seq."""
    out = {k: as_number(v) for k, v in d.items()}
    if out.get("x_count"):
        out["x_mean"] = out["x_sum"] / out["x_count"]
    if out.get("n_seq"):
        out["len_mean"] = out["len_sum"] / out["n_seq"]
    return out


STATISTIC_KEYS = {"mean": "x_mean", "min": "x_min", "max": "x_max", "sum": "x_sum", "count": "x_count",
                  "len_mean": "len_mean", "len_min": "len_min", "len_max": "len_max", "n_seq": "n_seq"}

statistics_pipeline = MetricPipeline(
    emit=emit_statistics,
    reduce_micro=reduce_statistics,
    reduce_dp=reduce_statistics,
    finalize=finalize_statistics,
    stats=STATISTIC_KEYS,
)

global_agg_loss = AggLoss(loss=F.agg_loss_micro, micro_combine="sum", dp_combine="mean")


# ------------------------------------------------------------------------------------ distributed
# Correct implementations over torch.distributed (the distributed tests check every engine against
# the float64 reference; these must pass). Each rank holds a contiguous vocab shard; the statistic is
# computed in the compute dtype (fp32, fp64 for fp64), all-reduced (MAX of the row maxima, then SUM),
# rounded to the input dtype. Nothing is written into the caller's tensors. Backward is local to the
# shard (the loss is replicated on the TP ranks, Megatron's convention): no collective in backward.


def _vp_shift(x: torch.Tensor, group):
    """(shifted = x − global max, exp(shifted), Σ exp over the whole vocab): all new tensors."""
    import torch.distributed as dist

    m = x.detach().amax(dim=-1, keepdim=True)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    shifted = x - m  # -inf stays -inf (p = 0); a shard of only -inf is fine: m is the global max
    e = shifted.exp()
    s = e.sum(-1, keepdim=True)
    dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
    return shifted, e, s


class _VPTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, labels, group):
        import torch.distributed as dist

        x = local_logits.detach().to(F.compute_dtype(local_logits.dtype))
        shifted, e, s = _vp_shift(x, group)
        v_local = x.shape[-1]
        start = dist.get_rank(group) * v_local
        lab = labels.long()
        here = (lab >= start) & (lab < start + v_local)
        idx = torch.where(here, lab - start, torch.zeros_like(lab))
        picked = shifted.gather(-1, idx.unsqueeze(-1)).squeeze(-1)
        picked = torch.where(here, picked, torch.zeros_like(picked))
        dist.all_reduce(picked, op=dist.ReduceOp.SUM, group=group)
        ctx.save_for_backward(e / s, idx, here)
        ctx.in_dtype = local_logits.dtype
        return (picked - s.squeeze(-1).log()).to(local_logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        p, idx, here = ctx.saved_tensors
        onehot = torch.zeros_like(p).scatter_(-1, idx.unsqueeze(-1), here.unsqueeze(-1).to(p.dtype))
        g = (onehot - p) * grad.to(p.dtype).unsqueeze(-1)
        return g.to(ctx.in_dtype), None, None


class _VPSmoothedTokenLogprobs(torch.autograd.Function):
    """(1 − α)·log p_y + α·mean_v log p_v with the label's logit, Σ exp and Σ (x − m) all-reduced over the
    TP group, V the whole vocab (every shard's size × the group size)."""

    @staticmethod
    def forward(ctx, local_logits, labels, label_smoothing, group):
        import torch.distributed as dist

        x = local_logits.detach().to(F.compute_dtype(local_logits.dtype))
        shifted, e, s = _vp_shift(x, group)
        v_local = x.shape[-1]
        vocab = v_local * dist.get_world_size(group)
        start = dist.get_rank(group) * v_local
        lab = labels.long()
        here = (lab >= start) & (lab < start + v_local)
        idx = torch.where(here, lab - start, torch.zeros_like(lab))
        picked = torch.where(here, shifted.gather(-1, idx.unsqueeze(-1)).squeeze(-1), torch.zeros((), dtype=x.dtype))
        total = shifted.sum(-1)
        both = torch.stack([picked, total])
        dist.all_reduce(both, op=dist.ReduceOp.SUM, group=group)
        log_s = s.squeeze(-1).log()
        a = float(label_smoothing)
        out = (1.0 - a) * (both[0] - log_s) + a * (both[1] / vocab - log_s)
        ctx.save_for_backward(e / s, idx, here)
        ctx.alpha, ctx.vocab, ctx.in_dtype = a, vocab, local_logits.dtype
        return out.to(local_logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        p, idx, here = ctx.saved_tensors
        onehot = torch.zeros_like(p).scatter_(-1, idx.unsqueeze(-1), here.unsqueeze(-1).to(p.dtype))
        g = ((1.0 - ctx.alpha) * onehot + ctx.alpha / ctx.vocab - p) * grad.to(p.dtype).unsqueeze(-1)
        return g.to(ctx.in_dtype), None, None, None


class _VPEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, group):
        import torch.distributed as dist

        x = local_logits.detach().to(F.compute_dtype(local_logits.dtype))
        shifted, e, s = _vp_shift(x, group)
        p = e / s
        ps = torch.where(p > 0, p * shifted, torch.zeros_like(p)).sum(-1, keepdim=True)
        dist.all_reduce(ps, op=dist.ReduceOp.SUM, group=group)
        h = s.log() - ps  # H = log Σe − Σ p·(x − m)
        ctx.save_for_backward(p, shifted - s.log(), h)
        ctx.in_dtype = local_logits.dtype
        return h.squeeze(-1).to(local_logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        p, logp, h = ctx.saved_tensors
        g = torch.where(p > 0, -p * (logp + h), torch.zeros_like(p)) * grad.to(p.dtype).unsqueeze(-1)
        return g.to(ctx.in_dtype), None


class _VPSumPiSquared(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, group):
        import torch.distributed as dist

        x = local_logits.detach().to(F.compute_dtype(local_logits.dtype))
        _, e, s = _vp_shift(x, group)
        q = (e * e).sum(-1, keepdim=True)
        dist.all_reduce(q, op=dist.ReduceOp.SUM, group=group)
        spp = q / (s * s)
        ctx.save_for_backward(e / s, spp)
        ctx.in_dtype = local_logits.dtype
        return spp.squeeze(-1).to(local_logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        p, spp = ctx.saved_tensors
        g = 2 * p * (p - spp) * grad.to(p.dtype).unsqueeze(-1)
        return g.to(ctx.in_dtype), None


def vocab_parallel_token_logprobs(local_logits, labels, group):
    """log p_y over TP vocab shards: [..., V/tp], int [...] (global ids), group -> [...] on every rank."""
    return _VPTokenLogprobs.apply(local_logits, labels, group)


def vocab_parallel_smoothed_token_logprobs(local_logits, labels, label_smoothing, group):
    """Minus the label-smoothed cross-entropy over TP vocab shards: [..., V/tp], int [...] (global ids),
    α, group -> [...] on every rank (PyTorch's convention: α over all V classes)."""
    return _VPSmoothedTokenLogprobs.apply(local_logits, labels, label_smoothing, group)


def vocab_parallel_entropy(local_logits, group):
    """Entropy over TP vocab shards: [..., V/tp], group -> [...] on every rank."""
    return _VPEntropy.apply(local_logits, group)


def vocab_parallel_sum_pi_squared(local_logits, group):
    """Σπ² over TP vocab shards: [..., V/tp], group -> [...] on every rank (non-destructive)."""
    return _VPSumPiSquared.apply(local_logits, group)


def cp_masked_mean(local_values, local_mask, group):
    """Token-mean of a sequence split over CP ranks: local masked sum and nnz, both all-reduced (SUM)
    over the CP group, divided once: [B, T/cp], [B, T/cp], group -> 0-d (dtype of the values). Masked
    positions are selected out (``where``), never multiplied by 0 (NaN · 0 = NaN)."""
    import torch.distributed as dist

    v = local_values.detach().to(F.compute_dtype(local_values.dtype))
    m = local_mask.to(v.dtype)
    t = torch.stack([torch.where(local_mask.bool(), v, torch.zeros((), dtype=v.dtype)).sum(), m.sum()])
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return (t[0] / t[1]).to(local_values.dtype)


def dp_metric_all_reduce(local_values, local_mask, group):
    """A token metric over DP ranks, the sum/count way (the sum/count fix of SkyRL issue #1822): each rank emits its masked
    sum and nnz, both all-reduced (SUM, float64) over the DP group, divided once -> Python float."""
    import torch.distributed as dist

    v = local_values.detach().to(torch.float64)
    m = local_mask.to(torch.float64)
    t = torch.stack([(v * m).sum(), m.sum()])
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return float(t[0] / t[1]) if float(t[1]) else float("nan")

def dp_masked_whiten(local_values, local_mask, group, shift_mean=True):
    """Whitening with statistics global over the DP ``group``, two passes: the masked sum and
    nnz all-reduced (SUM), then the sum of squared deviations from the global mean all-reduced, divided
    once by nnz − 1 (unbiased; σ² := 0 when nnz ≤ 1, as the reference defines it). [b, T], [b, T], group,
    bool -> [b, T] (the values' dtype; fp32 arithmetic for 16-bit inputs; masked outputs 0)."""
    import torch.distributed as dist

    cd = F.compute_dtype(local_values.dtype)
    keep = local_mask != 0
    zero = torch.zeros((), dtype=cd)
    x = torch.where(keep, local_values.detach().to(cd), zero)
    t = torch.stack([x.sum(), keep.sum().to(cd)])
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    n = t[1]
    if float(n) == 0:
        return torch.zeros_like(x).to(local_values.dtype)
    mean = t[0] / n
    dev = torch.where(keep, x - mean, zero)
    ss = (dev * dev).sum()
    dist.all_reduce(ss, op=dist.ReduceOp.SUM, group=group)
    var = ss / (n - 1) if float(n) > 1 else zero
    out = dev * torch.rsqrt(var + A.WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return torch.where(keep, out, zero).to(local_values.dtype)


def _outcome_estimator(estimator: str):
    def outcome_advantage(token_level_rewards, response_mask, index, **extras):
        return A.faithful_outcome_advantage(estimator, token_level_rewards, response_mask, index, **extras)

    outcome_advantage.__qualname__ = f"reference.outcome_advantage[{estimator}]"
    return outcome_advantage


def chunked_entropy(logits, chunk_size=2048):
    """Entropy of ``logits [N, ..., V]`` in chunks of ``chunk_size`` along dim 0 (the faithful entropy per
    chunk, concatenated): the reference's ``entropy@chunked``."""
    return torch.cat([F.entropy(logits[i:i + chunk_size]) for i in range(0, logits.shape[0], chunk_size)])


def rowwise_token_logprobs(logits, labels):
    """``token_logprobs`` one row (dim 0) at a time, stacked: the reference's ``token_logprobs@rowwise``."""
    return torch.stack([F.token_logprobs(x, y) for x, y in zip(logits, labels)])


def fused_linear_token_stats(hidden, weight, labels, temperature, chunk_size):
    """The faithful fused-linear log-probs and entropy (chunks of ``chunk_size`` rows), rounded to the input dtype."""
    lp, ent = F.fused_linear_token_stats(hidden, weight, labels, temperature, chunk_size)
    return lp.to(hidden.dtype), ent.to(hidden.dtype)


def vocab_parallel_entropy_chunked(local_logits, group, chunk_size=2048):
    """:func:`vocab_parallel_entropy` in chunks of ``chunk_size`` along dim 0, concatenated."""
    return torch.cat([vocab_parallel_entropy(local_logits[i:i + chunk_size], group)
                      for i in range(0, local_logits.shape[0], chunk_size)])


#: the reference's alternative implementations: ranks 2 and 3, the input's dtype out
IMPLEMENTATIONS = {
    "vocab_parallel_entropy": {"chunked": Implementation(vocab_parallel_entropy_chunked, out_dtype="input",
                                                         chunk_arg="chunk_size")},
    "vocab_parallel_token_logprobs": {"fused": Implementation(vocab_parallel_token_logprobs, out_dtype="input")},
    "entropy": {"chunked": Implementation(chunked_entropy, out_dtype="input", chunk_arg="chunk_size")},
    "token_logprobs": {"naive": Implementation(F.token_logprobs, out_dtype="input"),
                       "rowwise": Implementation(rowwise_token_logprobs, out_dtype="input")},
}


binding = Binding(
    name="reference",
    version=None,
    ops={
        "logsumexp": F.logsumexp,
        "token_logprobs": F.token_logprobs,
        "entropy": F.entropy,
        "sum_pi_squared": F.sum_pi_squared,
        "smoothed_token_logprobs": F.smoothed_token_logprobs,
        "masked_sum": F.masked_sum,
        "masked_count": F.masked_count,
        "masked_mean": F.masked_mean,
        "masked_var": F.masked_var,
        "masked_std": F.masked_std,
        "masked_min": F.masked_min,
        "masked_max": F.masked_max,
        "agg_loss": global_agg_loss,
        "metric_pipeline": sum_count_pipeline,
        "metric_statistics": statistics_pipeline,
        "optimal_token_baseline": F.optimal_token_baseline,
        "fused_linear_token_stats": fused_linear_token_stats,
        "vocab_parallel_token_logprobs": vocab_parallel_token_logprobs,
        "vocab_parallel_smoothed_token_logprobs": vocab_parallel_smoothed_token_logprobs,
        "vocab_parallel_entropy": vocab_parallel_entropy,
        "vocab_parallel_sum_pi_squared": vocab_parallel_sum_pi_squared,
        "cp_masked_mean": cp_masked_mean,
        "dp_metric_all_reduce": dp_metric_all_reduce,
        "dp_masked_whiten": dp_masked_whiten,
        "outcome_advantage": Variants({e: _outcome_estimator(e) for e in A.ESTIMATORS}),
        "gae": A.faithful_gae,
        "masked_whiten": A.faithful_masked_whiten,
        "kl_estimator": _kl.reference_variants(),
        "policy_loss": _pl.reference_variants(),
        "importance_ratio": _ir.reference_variants(),
        "rollout_rejection_mask": _rs.reference_variants(),
        "value_loss": _vl.reference_variants(),
        "policy_step": PolicyStep(run=_step.fp32_step, modes=_step.MODES, token_budgets=True, dp_sizes=(1, 2),
                                  mini_batches=True),
        "policy_step_metrics": PolicyStep(run=_step.fp32_step, modes=_step.MODES, token_budgets=True,
                                          dp_sizes=(1, 2), mini_batches=True),
        "batch_metrics": Variants({"actor": lambda batch: _bm.faithful(batch, critic=False),
                                   "critic": lambda batch: _bm.faithful(batch, critic=True)}),
    },
    notes={"all": "dtype-faithful torch computations (rlconform.harness.core.faithful)",
           "kl_estimator": "the float64 reference as an autograd op, rounded to the input dtype",
           "policy_loss": "the float64 reference per micro-batch (global token-mean normaliser) as an autograd op, "
                          "rounded to the input dtype; metrics folded token-weighted (sum/count)",
           "importance_ratio": "the float64 reference as an autograd op, rounded to the input dtype",
           "rollout_rejection_mask": "the float64 reference (mask in the input dtype, metrics as Python floats)",
           "value_loss": "the float64 reference per micro-batch (each row's token sum weighted by the mini-batch's "
                         "normaliser) as an autograd op, rounded to the input dtype; vf_clipfrac folded token-weighted",
           "policy_step": "a plain float32 step (old log-probs without gradient, then for each mini-batch one "
                          "backward per micro-batch with the mini-batch's normaliser, its gradient recorded; metrics "
                          "token-weighted over the batch)"},
    implementations=IMPLEMENTATIONS,
)

"""The ``reference`` engine: the dtype-faithful computations of :mod:`rlconform.harness.faithful`.

It must pass every property; the self-tests assert so. Its metric pipeline is the sum/count fix of
SkyRL issue #1822 (seed 000), made numerically stable: workers emit masked sums, counts, the sum of
squared deviations from their own mean (M2), min and max; every reduction adds sums and counts and
merges M2 with Chan et al.'s parallel formula (1979), instead of E[x²] − E[x]², which cancels
catastrophically for values with a large offset; the trainer divides once.
"""

from __future__ import annotations

import math

import torch

from rlconform.harness import faithful as F
from rlconform.harness.binding import AggLoss, Binding, MetricPipeline


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

global_agg_loss = AggLoss(loss=F.agg_loss_micro, micro_combine="sum", dp_combine="mean")

binding = Binding(
    name="reference",
    version=None,
    ops={
        "logsumexp": F.logsumexp,
        "token_logprobs": F.token_logprobs,
        "entropy": F.entropy,
        "sum_pi_squared": F.sum_pi_squared,
        "masked_sum": F.masked_sum,
        "masked_count": F.masked_count,
        "masked_mean": F.masked_mean,
        "masked_var": F.masked_var,
        "masked_std": F.masked_std,
        "masked_min": F.masked_min,
        "masked_max": F.masked_max,
        "agg_loss": global_agg_loss,
        "metric_pipeline": sum_count_pipeline,
        "optimal_token_baseline": F.optimal_token_baseline,
    },
    notes={"all": "dtype-faithful torch computations (rlconform.harness.faithful)"},
)

"""Mean of ratios across DP ranks (verl issue #7321): a ratio metric (e.g. clip fraction) reduced correctly
within a DP rank, then averaged across DP ranks: rank 0 has 3 of 12 tokens clipped, rank 1 3 of 4,
giving 0.5 instead of 6/16 = 0.375."""

from statistics import fmean

from rlconform.harness.bindings.reference import emit_sums, reduce_sums
from rlconform.harness.catalog.binding import MetricPipeline
from rlconform.harness.mutants._base import mutant


def _rank_mean(parts):
    d = reduce_sums(parts)
    return {"x_mean": d["x_sum"] / d["x_nnz"] if d["x_nnz"] else 0.0, "x_nnz": d["x_nnz"]}


def _dp_avg(parts):  # all_reduce(AVG) of per-rank ratios
    return {"x_mean": fmean(p["x_mean"] for p in parts), "x_nnz": sum(p["x_nnz"] for p in parts)}


def _mini(parts):
    return _dp_avg(parts)


def dp_metric_all_reduce(local_values, local_mask, group):
    """On real DP ranks: each rank's masked mean, all-reduced with AVG (SUM / world size)."""
    import torch
    import torch.distributed as dist

    m = local_mask.to(torch.float64)
    n = m.sum()
    local = (local_values.detach().double() * m).sum() / n.clamp(min=1)
    dist.all_reduce(local, op=dist.ReduceOp.SUM, group=group)
    return float(local) / dist.get_world_size(group)


EXPECTED = [("metric_pipeline", "matches_reference"), ("metric_pipeline", "partition_invariant"),
            ("dp_metric_all_reduce", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "metric_pipeline.matches_reference.float32.imbalanced_partitions",
    "metric_pipeline.partition_invariant.float32.imbalanced_partitions",
    "dp_metric_all_reduce.matches_reference.float32.dp2_imbalanced",
]
binding = mutant("dp_mean_of_ratios", __doc__, dp_metric_all_reduce=dp_metric_all_reduce, metric_pipeline=MetricPipeline(
    emit=emit_sums, reduce_micro=_rank_mean, reduce_dp=_dp_avg, reduce_mini=_mini, finalize=dict,
    stats={"mean": "x_mean"}, emitted_to_final={"x_sum": "x_mean", "x_m2": "x_mean", "x_nnz": "x_nnz",
                                                "x_min": "x_mean", "x_max": "x_mean"}))

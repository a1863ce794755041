"""Mean of per-shard means (SkyRL issue #1822): a metric reported as a mean of per-shard
means. Each micro-batch emits its masked mean; every reduction averages. Exact only when shards are
balanced: shard A 1 token of 1.0, shard B 100 tokens of 2.0 gives 1.5 instead of 201/101."""

from statistics import fmean

from rlconform.harness.catalog.binding import MetricPipeline
from rlconform.harness.mutants._base import mutant


def _emit(values, mask):
    m = mask.bool()
    n = int(m.sum())
    return {"x_mean": float(values.double()[m].sum() / max(n, 1))}


def _avg(parts):
    return {"x_mean": fmean(p["x_mean"] for p in parts)}


EXPECTED = [("metric_pipeline", "matches_reference"), ("metric_pipeline", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "metric_pipeline.matches_reference.float32.imbalanced_partitions",
    "metric_pipeline.partition_invariant.float32.imbalanced_partitions",
    "metric_pipeline.partition_invariant.float64.imbalanced_partitions",
]
binding = mutant("mean_of_shard_means", __doc__, metric_pipeline=MetricPipeline(
    emit=_emit, reduce_micro=_avg, reduce_dp=_avg, finalize=dict, stats={"mean": "x_mean"}))

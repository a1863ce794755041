"""Double normalisation (NeMo-RL issue #212): each micro-batch logs its loss already divided by the
number of micro-batches (as scaled for gradient accumulation), and the logs are then averaged instead
of summed: 4 micro-batches of loss 1.0 log 0.25."""

from statistics import fmean

from rlconform.harness.catalog.binding import MetricPipeline
from rlconform.harness.mutants._base import mutant


def _emit(values, mask, info):
    m = mask.bool()
    n = int(m.sum())
    return {"x_mean": float(values.double()[m].sum() / max(n, 1)) / info["num_micro_batches"]}


def _avg(parts):
    return {"x_mean": fmean(p["x_mean"] for p in parts)}


EXPECTED = [("metric_pipeline", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "metric_pipeline.matches_reference.float32.imbalanced_partitions",
    "metric_pipeline.matches_reference.float64.imbalanced_partitions",
]
binding = mutant("double_normalisation", __doc__, metric_pipeline=MetricPipeline(
    emit=_emit, reduce_micro=_avg, reduce_dp=_avg, finalize=dict, stats={"mean": "x_mean"}))

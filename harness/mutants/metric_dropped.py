"""Metric silently dropped (SkyRL PR for #1822, review comment): a worker emits its entropy sum as a
0-d torch tensor; the reducer keeps only int/float values, so the key silently vanishes."""

import torch

from rlconform.harness.bindings.reference import emit_sums, finalize_sums, reduce_sums
from rlconform.harness.catalog.binding import MetricPipeline
from rlconform.harness.mutants._base import mutant


def _emit(values, mask):
    d = emit_sums(values, mask)
    d["x_sum"] = torch.tensor(d["x_sum"], dtype=torch.float64)  # packed-sequence branch returns a tensor
    return d


def _reduce(parts):
    keys = {k for p in parts for k, v in p.items() if isinstance(v, (int, float))}  # drops tensors silently
    kept = [{k: p[k] for k in keys} for p in parts]
    if "x_sum" not in keys:
        return {k: (min if k == "x_min" else max if k == "x_max" else sum)(p[k] for p in kept) for k in keys}
    return reduce_sums(kept)


def _finalize(d):
    return finalize_sums(d) if "x_sum" in d else dict(d)


EXPECTED = [("metric_pipeline", "metric_integrity")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "metric_pipeline.metric_integrity.float32.imbalanced_partitions",
    "metric_pipeline.metric_integrity.float64.imbalanced_partitions",
]
binding = mutant("metric_dropped", __doc__, metric_pipeline=MetricPipeline(
    emit=_emit, reduce_micro=_reduce, reduce_dp=_reduce, finalize=_finalize,
    stats={"min": "x_min", "max": "x_max"}))

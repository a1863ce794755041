"""A metric printed instead of logged (SkyRL ``worker_utils.reduce_metrics``): a key whose values are not all Python ``int`` /
``float`` (a 0-d tensor, a NumPy scalar) is printed ("Metrics for key k are not all numbers") and skipped:
the value is printed instead of logged. Python numbers pass, so only the tensor / NumPy regimes catch it."""

import dataclasses

from rlconform.harness.bindings.reference import reduce_statistics, statistics_pipeline
from rlconform.harness.mutants._base import mutant


def _reduce(parts):
    kept = [dict(p) for p in parts]
    for k in sorted({k for p in parts for k in p}):
        values = [p[k] for p in parts if k in p]
        if not all(isinstance(x, (int, float)) for x in values):
            print(f"Metrics for key {k} are not all numbers: {values}")
            for p in kept:
                p.pop(k, None)
    return reduce_statistics(kept)


EXPECTED = [("metric_statistics", "metric_integrity")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "metric_statistics.metric_integrity.float32.numpy_values",
    "metric_statistics.metric_integrity.float64.tensor_values",
]
binding = mutant("ms_prints_instead", __doc__, metric_statistics=dataclasses.replace(
    statistics_pipeline, reduce_micro=_reduce, reduce_dp=_reduce))

"""The reducer keeps only Python ``float`` values and silently drops the rest: integer
counts and lengths, 0-d tensors, NumPy scalars never reach the logger (no error, no message)."""

import dataclasses

from rlconform.harness.bindings.reference import reduce_statistics, statistics_pipeline
from rlconform.harness.mutants._base import mutant


def _reduce(parts):
    kept = [{k: v for k, v in p.items() if type(v) is float} for p in parts]  # ints, tensors, NumPy: gone
    return reduce_statistics(kept)


def _finalize(d):
    out = dict(d)
    if "x_count" in out and "x_sum" in out and out["x_count"]:
        out["x_mean"] = out["x_sum"] / out["x_count"]
    return out


EXPECTED = [("metric_statistics", "metric_integrity")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "metric_statistics.metric_integrity.float32.numpy_values",
    "metric_statistics.metric_integrity.float64.tensor_values",
]
binding = mutant("ms_drops_non_float", __doc__, metric_statistics=dataclasses.replace(
    statistics_pipeline, reduce_micro=_reduce, reduce_dp=_reduce, finalize=_finalize))

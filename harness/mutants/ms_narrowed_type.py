"""The trainer logs every metric as a NumPy float32 (``np.float32(v)``, as an array
``.astype(np.float32)`` would): an integer count becomes a float32 and a float64 value loses 29 bits —
the value changed in type on its way to the logger."""

import dataclasses

import numpy as np

from rlconform.harness.bindings.reference import finalize_statistics, statistics_pipeline
from rlconform.harness.mutants._base import mutant


def _finalize(d):
    return {k: np.float32(v) for k, v in finalize_statistics(d).items()}


EXPECTED = [("metric_statistics", "metric_integrity")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "metric_statistics.metric_integrity.float32.numpy_values",
    "metric_statistics.metric_integrity.float64.tensor_values",
]
binding = mutant("ms_narrowed_type", __doc__, metric_statistics=dataclasses.replace(
    statistics_pipeline, finalize=_finalize))

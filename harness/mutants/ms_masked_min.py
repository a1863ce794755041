"""A masked min by multiplication (SkyRL ``compute_minibatch_rollout_logprob_diff_metrics``): a worker logs the min / max
of a non-negative token quantity as ``(x * mask).min()`` / ``.max()``: masked positions enter as 0, so the
min of any micro-batch with padding is 0, and garbage there (NaN·0 = NaN) reaches both statistics."""

import dataclasses
import math

from rlconform.harness.bindings.reference import emit_statistics, statistics_pipeline
from rlconform.harness.mutants._base import mutant


def _emit(values, mask):
    d = emit_statistics(values, mask)
    m = mask.to(values.dtype)
    n = d["x_count"]
    d["x_min"] = float((values * m).min()) if n else math.inf  # masked positions read as 0
    d["x_max"] = float((values * m).max()) if n else -math.inf
    return d


EXPECTED = [("metric_statistics", "matches_reference"), ("metric_statistics", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "metric_statistics.matches_reference.float32.tensor_values",
    "metric_statistics.matches_reference.float64.numpy_values",
    "metric_statistics.mask_invariant.float32.tensor_values",
    "metric_statistics.mask_invariant.float64.numpy_values",
]
binding = mutant("ms_masked_min", __doc__, metric_statistics=dataclasses.replace(statistics_pipeline, emit=_emit))

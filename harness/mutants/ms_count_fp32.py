"""A DP reduction in float32 (SkyRL ``DistributedStrategy.all_reduce``: ``torch.Tensor([v])``): the reduction
carries integer metrics in float32, exact only up to 2²⁴ = 16 777 216: a step with an odd token count
above that logs a count one token off (and an ``int`` comes back as a ``float``). Below 2²⁴ it is exact,
so only the ``large_counts`` regime catches it."""

import dataclasses

import torch

from rlconform.harness.bindings.reference import reduce_statistics, statistics_pipeline
from rlconform.harness.mutants._base import mutant


def _reduce_dp(parts):
    out = reduce_statistics(parts)
    return {k: (torch.tensor([v], dtype=torch.float32).item() if isinstance(v, int) else v) for k, v in out.items()}


EXPECTED = [("metric_statistics", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "metric_statistics.matches_reference.float32.large_counts",
]
binding = mutant("ms_count_fp32", __doc__,
                 metric_statistics=dataclasses.replace(statistics_pipeline, reduce_dp=_reduce_dp))

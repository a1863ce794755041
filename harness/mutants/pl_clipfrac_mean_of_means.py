"""Clip fraction as a mean of micro-batch means: each micro-batch logs
its own pg_clipfrac / ppo_kl (a mean over its tokens) and the trainer averages the micro-batches' values,
empty micro-batches included, instead of Σ clipped / Σ tokens: the logged metric depends on how the
mini-batch was split."""

import math

from rlconform.harness.catalog.binding import LossVariants
from rlconform.harness.families import policy_loss as PL
from rlconform.harness.mutants._base import mutant


def _mean_of_means(parts):
    keys = sorted({k for metrics, _ in parts for k in metrics})
    return {k: math.fsum(float(m.get(k, 0.0)) for m, _ in parts) / len(parts) for k in keys}


EXPECTED = [("policy_loss", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_loss.partition_invariant.float32.dppo_binary_tv@moderate",
    "policy_loss.partition_invariant.float64.rollout_is@moderate",
]
binding = mutant("pl_clipfrac_mean_of_means", __doc__,
                 policy_loss=LossVariants({v: PL.faithful_loss(v) for v in PL.VARIANTS},
                                          combine_metrics=_mean_of_means))

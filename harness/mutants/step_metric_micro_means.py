"""A wiring mutant of the policy step: the token fractions it logs (pg_clipfrac, pg_clipfrac_lower, ppo_kl) are the
mean of per-micro-batch means instead of one token-weighted mean over the mini-batch: exact only for balanced
micro-batches (the gradient is right)."""

import functools

from rlconform.harness.catalog.binding import PolicyStep
from rlconform.harness.families.policy_step import fp32_step
from rlconform.harness.mutants._base import mutant

EXPECTED = [("policy_step_metrics", "matches_reference"), ("policy_step_metrics", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step_metrics.matches_reference.float32.token-mean@trainer_batches",
    "policy_step_metrics.partition_invariant.float32.token-mean@trainer_batches",
]
binding = mutant("step_metric_micro_means", __doc__,
                 **dict.fromkeys(("policy_step", "policy_step_metrics"),
                                PolicyStep(run=functools.partial(fp32_step, metric_micro_means=True))))

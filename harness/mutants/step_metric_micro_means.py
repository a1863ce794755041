"""A wiring mutant of the policy step: the token fractions it logs (pg_clipfrac, pg_clipfrac_lower, ppo_kl) are the
mean of per-micro-batch means instead of one token-weighted mean over the mini-batch: exact only for balanced
micro-batches (the gradient is right)."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step_metrics", "matches_reference"), ("policy_step_metrics", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step_metrics.matches_reference.float32.token-mean@trainer_batches",
    "policy_step_metrics.partition_invariant.float32.token-mean@trainer_batches",
]
binding = step_mutant("step_metric_micro_means", __doc__, metric_micro_means=True)

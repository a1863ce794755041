"""A wiring mutant of the policy step: each DP rank divides its loss by its own token count (or rows) instead of
the count all-reduced over the DP group, and the ranks' gradients are averaged: the gradient is a mean of per-rank
means, exact only when the ranks hold equal counts (the DP-scoped normaliser)."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.partition_invariant.float32.token-mean@trainer_batches",
]
binding = step_mutant("step_rank_normaliser", __doc__, rank_normaliser=True)

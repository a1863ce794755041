"""A wiring mutant of the policy step: each micro-batch's loss is divided by its own token count (or rows) instead of
the mini-batch's: exact only for balanced micro-batches."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "matches_reference"), ("policy_step", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean@trainer_batches",
    "policy_step.partition_invariant.float32.token-mean@trainer_batches",
]
binding = step_mutant("step_micro_normaliser", __doc__, micro_normaliser=True)

"""A wiring mutant of the policy step: the fraction of importance weights above the TIS cap is logged from the
weights after their truncation at the cap, so it is always 0 (a diagnostic logged after truncation)."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step_metrics", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step_metrics.matches_reference.float32.token-mean-with-tis@trainer_batches",
    "policy_step_metrics.matches_reference.float32.token-mean-with-seq-tis@trainer_batches",
]
binding = step_mutant("step_fraction_after_truncation", __doc__, fraction_after_truncation=True)

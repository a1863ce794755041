"""A wiring mutant of the policy step: the token mask of the rollout correction (a token kept when its ratio
π_old/π_rollout lies in a band) is configured but never applied, while the row-level rejection still is: every
token outside the band keeps its loss, its gradient and its place in the token count."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "matches_reference"), ("policy_step_metrics", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean-with-token-mask@trainer_batches",
    "policy_step_metrics.matches_reference.float32.token-mean-with-token-mask@trainer_batches",
]
binding = step_mutant("step_token_mask_ignored", __doc__, token_mask_ignored=True)

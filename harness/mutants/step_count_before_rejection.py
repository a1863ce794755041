"""A wiring mutant of the policy step: the loss normaliser (token count, non-empty rows) is counted on the response
mask before the rollout rejection removed rows (or, with a token mask, tokens) from it, while the loss itself sums
over the kept tokens only: the loss and the gradient shrink by the kept fraction."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "matches_reference"), ("policy_step_metrics", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean-with-rejection@trainer_batches",
    "policy_step.matches_reference.float32.seq-mean-token-mean-with-rejection@trainer_batches",
    "policy_step_metrics.matches_reference.float32.token-mean-with-rejection@trainer_batches",
    "policy_step.matches_reference.float32.token-mean-with-token-mask@trainer_batches",
    "policy_step_metrics.matches_reference.float32.token-mean-with-token-mask@trainer_batches",
]
binding = step_mutant("step_count_before_rejection", __doc__, count_before_rejection=True)

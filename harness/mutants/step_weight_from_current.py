"""A wiring mutant of the policy step: the truncated importance weight is computed from the *current* log-probs
instead of the proximal (old) ones, min(π_θ/π_rollout, cap): the weight moves with the policy and carries a
gradient."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "matches_reference"), ("policy_step_metrics", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean-with-tis@trainer_batches",
    "policy_step_metrics.matches_reference.float32.token-mean-with-tis@trainer_batches",
    "policy_step.matches_reference.float32.token-mean-with-seq-tis@trainer_batches",
]
binding = step_mutant("step_weight_from_current", __doc__, weight_from_current=True)

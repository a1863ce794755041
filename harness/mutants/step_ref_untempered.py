"""A wiring mutant of the policy step: the reference model's log-probs of the KL loss are computed without the
sampling temperature while the current ones are tempered: the KL is between two different families of policies,
not zero when the parameters are the reference's, and its gradient pulls toward the untempered reference."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "matches_reference"), ("policy_step_metrics", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean-with-kl@trainer_batches",
    "policy_step_metrics.matches_reference.float32.token-mean-with-kl@trainer_batches",
]
binding = step_mutant("step_ref_untempered", __doc__, ref_temperature=False)

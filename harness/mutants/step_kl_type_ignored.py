"""A wiring mutant of the policy step: the KL loss ignores the configured estimator and always computes k3
(``low_var_kl``, the default): a trainer configured for k1 or k2 (verl ``kl_loss_type``, SkyRL
``kl_estimator_type``) gets another loss and gradient, and logs another ``kl_loss``, with every function of the
step right on its own."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "matches_reference"), ("policy_step_metrics", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean-with-kl-k1@trainer_batches",
    "policy_step.matches_reference.float32.token-mean-with-kl-k2@trainer_batches",
    "policy_step_metrics.matches_reference.float32.token-mean-with-kl-k2@trainer_batches",
]
binding = step_mutant("step_kl_type_ignored", __doc__, kl_type_ignored=True)

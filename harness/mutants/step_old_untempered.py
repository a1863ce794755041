"""A wiring mutant of the policy step: the old (proximal) log-probs are computed without the temperature, the current
ones with it: the ratio is off by a factor that moves with the logits."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean@trainer_batches",
]
binding = step_mutant("step_old_untempered", __doc__, old_temperature=False)

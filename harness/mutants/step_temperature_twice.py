"""A wiring mutant of the policy step: the current log-probs divide the logits by the temperature twice (once in the
model wrapper, once in the log-prob helper)."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean@trainer_batches",
]
binding = step_mutant("step_temperature_twice", __doc__, temperature_times=2)

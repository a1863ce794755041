"""A wiring mutant of the policy step: the old (proximal) log-probs are computed without the temperature, the current ones with it: the ratio is off by a factor that moves with the logits."""

import functools

from rlconform.harness.catalog.binding import PolicyStep
from rlconform.harness.families.policy_step import fp32_step
from rlconform.harness.mutants._base import mutant

EXPECTED = [("policy_step", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean@trainer_batches",
]
binding = mutant("step_old_untempered", __doc__,
                 **dict.fromkeys(("policy_step", "policy_step_metrics"),
                                PolicyStep(run=functools.partial(fp32_step, old_temperature=False))))

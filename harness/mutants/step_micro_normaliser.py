"""A wiring mutant of the policy step: each micro-batch's loss is divided by its own token count (or rows) instead of the mini-batch's: exact only for balanced micro-batches."""

import functools

from rlconform.harness.catalog.binding import PolicyStep
from rlconform.harness.families.policy_step import fp32_step
from rlconform.harness.mutants._base import mutant

EXPECTED = [("policy_step", "matches_reference"), ("policy_step", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean@trainer_batches",
    "policy_step.partition_invariant.float32.token-mean@trainer_batches",
]
binding = mutant("step_micro_normaliser", __doc__,
                 **dict.fromkeys(("policy_step", "policy_step_metrics"),
                                PolicyStep(run=functools.partial(fp32_step, micro_normaliser=True))))

"""A wiring mutant of the policy step: the per-token loss is masked by multiplying with the loss mask, so garbage (NaN / inf) in the advantages at masked positions leaks into the loss and the gradient."""

import functools

from rlconform.harness.catalog.binding import PolicyStep
from rlconform.harness.families.policy_step import fp32_step
from rlconform.harness.mutants._base import mutant

EXPECTED = [("policy_step", "mask_invariant"), ("policy_step_metrics", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.mask_invariant.float32.token-mean@trainer_batches",
    "policy_step_metrics.mask_invariant.float32.token-mean@trainer_batches",
]
binding = mutant("step_nan_times_mask", __doc__,
                 **dict.fromkeys(("policy_step", "policy_step_metrics"),
                                PolicyStep(run=functools.partial(fp32_step, zero_masked_advantages=False))))

"""A wiring mutant of the policy step: the per-token loss is masked by multiplying with the loss mask, so
garbage (NaN, inf) in the advantages at masked positions leaks into the loss and the gradient."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "mask_invariant"), ("policy_step_metrics", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_step.mask_invariant.float32.token-mean@trainer_batches",
    "policy_step_metrics.mask_invariant.float32.token-mean@trainer_batches",
]
binding = step_mutant("step_nan_times_mask", __doc__, zero_masked_advantages=False)

"""A wiring mutant of the policy step with several mini-batches: each mini-batch's loss is divided by the token count
(or the non-empty rows) of the whole generation batch instead of its own (a ``global_token_num`` /
``batch_num_tokens`` counted over the batch, a ``global_batch_size`` that is the train batch size), so each optimizer
step's gradient shrinks by the mini-batch's share of the batch; with one mini-batch the step is exact."""

from rlconform.harness.mutants._step import step_mutant

EXPECTED = [("policy_step", "matches_reference"), ("policy_step_metrics", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile (every variant's do); tests/test_mutants.py checks only these
    "policy_step.matches_reference.float32.token-mean@trainer_batches",
    "policy_step.matches_reference.float32.seq-mean-token-mean@trainer_batches",
    "policy_step.matches_reference.float32.token-mean-with-rejection@trainer_batches",
    "policy_step_metrics.matches_reference.float32.token-mean@trainer_batches",
]
binding = step_mutant("step_batch_normaliser", __doc__, batch_normaliser=True)

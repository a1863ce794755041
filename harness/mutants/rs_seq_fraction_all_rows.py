"""The rejected-row fraction divided by every row of the batch (with multi-turn rows): a row
with no valid token (an all-observation multi-turn row, or one an earlier filter already rejected) has nothing
to reject but is counted in the denominator, so the logged ``rs_seq_masked_fraction`` shrinks with the number
of empty rows (verl 0.9.1 ``rollout_rs_seq_masked_fraction`` = ``seq_has_masked.float().mean()``; SkyRL 0.4.0
``*_sequence_mask_masked_ratio`` / ``outlier_seq_masked_ratio``: ``/ num_sequences``). Only masks with an
empty row catch it."""

from rlconform.harness.mutants._base import mutant
from rlconform.harness.mutants._rejection import faulty


def _all_rows(out, lp, old, m, kept):
    out = dict(out)
    out["rs_seq_masked_fraction"] *= float(m.any(-1).sum()) / m.shape[0]
    return out


EXPECTED = [("rollout_rejection_mask", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "rollout_rejection_mask.matches_reference.float32.seq_sum_k3@underflow",
    "rollout_rejection_mask.matches_reference.float64.chained@moderate",
]
binding = mutant("rs_seq_fraction_all_rows", __doc__, rollout_rejection_mask=faulty(metrics=_all_rows))

"""A sequence statistic of ``(log_prob − old_log_prob) * mask``: NaN or ±inf at a masked
position (a padded or tool-observation token the rollout never scored) times 0 is NaN, so the row's sum is
NaN, every comparison with the bounds is False and the whole row is rejected (SkyRL 0.4.0
``compute_sequence_mask``: ``(token_tis_log_ratio * loss_mask).sum(dim=-1)``, where the NaN compares False on
both sides and the row is kept instead: either way the decision no longer depends on the row's valid tokens).
Only garbage at masked positions (``mask_invariant``) catches it."""

import numpy as np

from rlconform.harness.mutants._base import mutant
from rlconform.harness.mutants._rejection import faulty


def _nan_rows(kept, lp, old, m, variant):
    from rlconform.harness.families.rejection_mask import VARIANTS

    if all(level == "token" for level, *_ in VARIANTS[variant]):
        return kept
    with np.errstate(invalid="ignore"):
        finite = np.isfinite((lp - old) * m).all(-1, keepdims=True)
    return kept * finite


EXPECTED = [("rollout_rejection_mask", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "rollout_rejection_mask.mask_invariant.float32.chained@moderate",
    "rollout_rejection_mask.mask_invariant.float64.seq_mean_k2@moderate",
]
binding = mutant("rs_nan_times_mask", __doc__, rollout_rejection_mask=faulty(keep=_nan_rows))

"""A sequence rejection statistic summed over per-token clamped log-ratios: each token's
log-ratio is clamped to ±20 (the engines' exp safety bound) *before* the row's sum / mean, so a row with a
token at +25 and one at −20.5 sums to 0 instead of 4.5 and is kept although its sequence ratio e^4.5 ≈ 90 is
far above the bound (verl 0.9.1 ``compute_rollout_rejection_mask``: ``log_ratio_safe`` feeds ``seq_sum_k1``
/ ``seq_mean_k1``). Only overflow-range log-ratios paired with an opposite one in a row catch it."""

import numpy as np

from rlconform.harness.mutants._base import mutant
from rlconform.harness.mutants._rejection import faulty


def _clamped(lp, old, m):
    return np.where(m, old + np.clip(lp - old, -20.0, 20.0), lp), old


EXPECTED = [("rollout_rejection_mask", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "rollout_rejection_mask.matches_reference.float32.seq_mean_k1@moderate",
    "rollout_rejection_mask.matches_reference.float64.seq_mean_k1@moderate",
]
binding = mutant("rs_clamped_token_sum", __doc__, rollout_rejection_mask=faulty(inputs=_clamped))

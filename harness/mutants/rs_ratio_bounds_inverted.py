"""Ratio bounds applied to the inverse ratio: a k1 filter documented as keeping
lower ≤ π_train/π_rollout ≤ upper keeps lower ≤ π_rollout/π_train ≤ upper, i.e. r ∈ [1/upper, 1/lower]
(verl 0.9.1 ``compute_rollout_rejection_mask``: ``token_k1 = -log_ratio_safe`` compared with
``log(lower)`` / ``log(upper)``). With reciprocal bounds (a single threshold) both readings agree: only an
asymmetric ``lower_upper`` pair (token_k1_asym: [0.5, 1.5]) catches it."""

from rlconform.harness.mutants._base import mutant
from rlconform.harness.mutants._rejection import faulty


def _inverted(options):
    return tuple((lvl, est, 1.0 / hi, 1.0 / lo) if est == "k1" else (lvl, est, lo, hi) for lvl, est, lo, hi in options)


EXPECTED = [("rollout_rejection_mask", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "rollout_rejection_mask.matches_reference.float32.token_k1_asym@moderate",
    "rollout_rejection_mask.matches_reference.float64.token_k1_asym@moderate",
]
binding = mutant("rs_ratio_bounds_inverted", __doc__, rollout_rejection_mask=faulty(options=_inverted))

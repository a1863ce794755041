"""An effective sample size with an absolute epsilon in its normaliser: ESS = 1 / mean((w /
(mean w + 1e-8))²) is scale-free only while mean w ≫ 1e-8; when every IS weight is small (every log-ratio
below about −14, e^−20 ≈ 2e-9 after the clamp) the normalised weights shrink and the ESS of equal weights
is 34 instead of 1 (verl 0.9.1 ``compute_is_metrics``: ``weights_for_ess / (mean_for_ess + 1e-8)``). Only the
underflow regime (every weight small) catches it."""

from rlconform.harness.mutants._base import mutant
from rlconform.harness.mutants._rejection import ess_with_epsilon, faulty


def _ess(out, lp, old, m, kept):
    return dict(out, is_ess=ess_with_epsilon(lp, old, m))


EXPECTED = [("rollout_rejection_mask", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "rollout_rejection_mask.matches_reference.float32.token_k1@underflow",
    "rollout_rejection_mask.matches_reference.float64.token_k2@moderate",
]
binding = mutant("rs_ess_epsilon", __doc__, rollout_rejection_mask=faulty(metrics=_ess))

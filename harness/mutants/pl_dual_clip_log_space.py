"""A dual clip decided in log space: vanilla PPO's dual clip (Ye et al. 2020, arXiv:1912.09729;
verl ``compute_policy_loss_vanilla``: ``min(−A·c, L')`` where A < 0) applied where the *log*-ratio exceeds
c instead of the ratio, so tokens with log c < Δ ≤ c (ratio 3 to 20 at c = 3) keep the unbounded −A·r.
Correct for |Δ| ≤ 1 and for Δ beyond the ±20 clamp, the only log-ratios the strategies drew before the
branch regions: only a ratio above c at an ordinary magnitude (Δ ≈ 1.1–3) catches it (loss, gradient,
pg_clipfrac_lower)."""

import math

from rlconform.harness.catalog.binding import LossVariants
from rlconform.harness.families import policy_loss as PL
from rlconform.harness.mutants._base import mutant

C = PL.VARIANTS["vanilla"]["clip_ratio_c"]
_dual = PL.faithful_loss("vanilla")
_no_dual = PL.faithful_loss("ppo_clip")


def _vanilla(old_log_prob, log_prob, advantages, response_mask, info):
    delta = (log_prob - old_log_prob).detach()
    # the fault: tokens with A < 0 and log c < Δ ≤ c are not dual-clipped (Δ compared with c, not log c)
    skip = response_mask.bool() & (advantages < 0) & (delta > math.log(C)) & (delta <= C)
    m_ok, m_skip = response_mask.bool() & ~skip, skip
    loss, metrics_ok = _dual(old_log_prob, log_prob, advantages, m_ok, info)
    parts = [(metrics_ok, int(m_ok.sum()))]
    if m_skip.any():
        l2, metrics_skip = _no_dual(old_log_prob, log_prob, advantages, m_skip, info)
        loss = loss + l2
        parts.append((dict(metrics_skip, pg_clipfrac_lower=0.0), int(m_skip.sum())))
    return loss, PL.token_weighted(parts)


_impls = {v: PL.faithful_loss(v) for v in PL.VARIANTS}
_impls["vanilla"] = _vanilla
EXPECTED = [("policy_loss", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_loss.matches_reference.float32.vanilla@moderate",
    "policy_loss.matches_reference.float64.vanilla@moderate",
]
binding = mutant("pl_dual_clip_log_space", __doc__,
                 policy_loss=LossVariants(_impls, combine_metrics=PL.token_weighted))

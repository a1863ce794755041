"""One-pass variance E[x²] − μ²: group variance by the one-pass formula E[x²] − μ² in float32. When a
group's rewards are equal or 1e-7 apart (0.95 × 8, or [0, 0.95 × 7] for the others of a row), x² and μ²
agree to every fp32 bit but the last, their difference is rounding noise (≈ 1e-7 instead of ≤ 1e-14),
σ ≈ 3e-4 instead of ~0 and the normalised advantage is off by orders of magnitude (the row's −2075 in
docs/bug-kinds.md). Two-pass Σ(x − μ)² (torch.std) does not cancel."""

import torch

from rlconform.harness.mutants._advantages import broadcast, groups, outcome_advantage, scores
from rlconform.harness.mutants._base import mutant

EPSILON = 1e-6


def grpo(token_level_rewards, response_mask, index):
    s, keep = scores(token_level_rewards, response_mask)
    a = torch.zeros_like(s)
    for rows in groups(index):
        g = s[rows]
        n = g.numel()
        if n == 1:
            continue
        mu = g.mean()
        var = ((g * g).mean() - mu * mu).clamp(min=0) * n / (n - 1)  # one pass: cancels
        a[rows] = (g - mu) / (var.sqrt() + EPSILON)
    return broadcast(a, keep, token_level_rewards.dtype)


EXPECTED = [("outcome_advantage", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "outcome_advantage.matches_reference.float64.grpo@near_constant",
]
binding = mutant("one_pass_group_variance", __doc__, outcome_advantage=outcome_advantage(grpo=grpo))

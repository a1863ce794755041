"""Family: leave-one-out baselines ("leave-one-out over the wrong count"). RLOO's baseline
for row i is the mean of the *other* n − 1 rewards of its group; this one divides their sum by n (the
group size), so a_i = s_i − (Σs − s_i)/n: the baseline shrinks by (n − 1)/n, every advantage is biased
towards s_i (a constant group no longer gets 0)."""

import torch

from rlconform.harness.mutants._advantages import broadcast, groups, outcome_advantage, scores
from rlconform.harness.mutants._base import mutant


def rloo(token_level_rewards, response_mask, index):
    s, keep = scores(token_level_rewards, response_mask)
    a = torch.zeros_like(s)
    for rows in groups(index):
        g = s[rows]
        n = g.numel()
        if n == 1:
            continue
        a[rows] = g - (g.sum() - g) / n  # should be / (n - 1)
    return broadcast(a, keep, token_level_rewards.dtype)


EXPECTED = [("outcome_advantage", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "outcome_advantage.matches_reference.float32.rloo@uneven_groups",
    "outcome_advantage.matches_reference.float64.rloo@uneven_groups",
]
binding = mutant("loo_wrong_count", __doc__, outcome_advantage=outcome_advantage(rloo=rloo))

"""Family: advantage group statistics ("whole-batch statistics for uneven groups"). GRPO
normalises every row with the mean and std of the *whole batch* instead of its prompt group's — right
only when the batch is one group; with several (uneven, shuffled) groups each row gets the wrong
baseline, and a singleton is no longer 0."""

import torch

from rlconform.harness.mutants._advantages import broadcast, outcome_advantage, scores
from rlconform.harness.mutants._base import mutant

EPSILON = 1e-6


def grpo(token_level_rewards, response_mask, index):
    s, keep = scores(token_level_rewards, response_mask)
    if s.numel() == 1:
        return broadcast(torch.zeros_like(s), keep, token_level_rewards.dtype)
    a = (s - s.mean()) / (s.std() + EPSILON)  # batch statistics: `index` ignored
    return broadcast(a, keep, token_level_rewards.dtype)


EXPECTED = [("outcome_advantage", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "outcome_advantage.matches_reference.float32.grpo@singleton_groups",
    "outcome_advantage.matches_reference.float64.grpo@uneven_groups",
]
binding = mutant("batch_group_stats", __doc__, outcome_advantage=outcome_advantage(grpo=grpo))

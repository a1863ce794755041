"""Two implementations of one estimator that disagree where a convention applies. The default
``grpo`` is the reference's (a group of one row gets advantage 0); the second, ``grpo+vectorized``,
computes every group's statistics at once with ``index_add_`` and gives a group of one row μ := 0, σ := 1,
i.e. its raw score (verl's and SkyRL's loop GRPO convention). Elsewhere the two agree to rounding, so only
``singleton_groups`` separates them: ``implementations_agree`` fails there (and the second implementation's
``matches_reference``); the default implementation passes everything."""

import numpy as np
import torch

from rlconform.harness.bindings.reference import binding as reference
from rlconform.harness.catalog.binding import Variants
from rlconform.harness.mutants._advantages import broadcast, scores
from rlconform.harness.mutants._base import mutant

EPSILON = 1e-6


def grpo_vectorized(token_level_rewards, response_mask, index):
    """GRPO with scatter-based group statistics; a singleton group keeps its raw score (the fault)."""
    s, keep = scores(token_level_rewards, response_mask)
    _, inverse = np.unique(np.asarray(index).reshape(-1), return_inverse=True)
    g = torch.from_numpy(inverse.reshape(-1))
    n_groups = int(g.max()) + 1 if g.numel() else 0
    count = torch.zeros(n_groups, dtype=s.dtype).index_add_(0, g, torch.ones_like(s))
    mean = torch.zeros(n_groups, dtype=s.dtype).index_add_(0, g, s) / count
    dev = s - mean[g]
    var = torch.zeros(n_groups, dtype=s.dtype).index_add_(0, g, dev * dev) / (count - 1).clamp(min=1)
    single = count[g] == 1
    a = torch.where(single, s / (1 + EPSILON), dev / (var.sqrt()[g] + EPSILON))
    return broadcast(a, keep, token_level_rewards.dtype)


EXPECTED = [("outcome_advantage", "implementations_agree")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "outcome_advantage.implementations_agree.float32.grpo+vectorized@singleton_groups",
    "outcome_advantage.implementations_agree.float64.grpo+vectorized@singleton_groups",
]
binding = mutant("vectorized_raw_singleton", __doc__, outcome_advantage=Variants(
    {"grpo": reference.ops["outcome_advantage"].impls["grpo"]},
    implementations={"vectorized": {"grpo": grpo_vectorized}}))

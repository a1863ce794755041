"""One NaN reward spreads to every group through NaN·0: a NaN reward must stay inside its own prompt group
(reference ``NAN_SCOPE["grpo"]``), but a vectorized GRPO that gathers group sums with a one-hot matrix
product (``onehot[G, B] @ scores[B]``) multiplies the NaN by every other group's 0 and spreads it to
the whole batch. The scores are ``(rewards · mask).sum(-1)``: a NaN (or ±inf) at a masked position
enters the same way, so a batch whose only non-finite value is masked padding comes back all NaN."""

import numpy as np
import torch

from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._advantages import broadcast, outcome_advantage
from rlconform.harness.mutants._base import mutant

EPSILON = 1e-6


def grpo(token_level_rewards, response_mask, index):
    cd = compute_dtype(token_level_rewards.dtype)
    keep = response_mask != 0
    s = (token_level_rewards.to(cd) * keep.to(cd)).sum(-1)
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    inverse = torch.from_numpy(inverse.reshape(-1))
    onehot = torch.nn.functional.one_hot(inverse).to(cd).T  # [G, B]
    count = onehot.sum(-1)
    mean = onehot @ s / count
    dev = s - mean[inverse]
    var = onehot @ (dev * dev) / (count - 1).clamp(min=1)
    a = torch.where(count[inverse] > 1, dev / (var.sqrt()[inverse] + EPSILON), torch.zeros((), dtype=cd))
    return broadcast(a, keep, token_level_rewards.dtype)


EXPECTED = [("outcome_advantage", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "outcome_advantage.mask_invariant.float32.grpo@uneven_groups",
    "outcome_advantage.mask_invariant.float64.grpo@uneven_groups",
]
binding = mutant("nan_across_groups", __doc__, outcome_advantage=outcome_advantage(grpo=grpo))

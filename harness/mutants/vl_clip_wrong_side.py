"""Value clip on the wrong side (a logic error): the clipped value loss
takes the *minimum* of the unclipped and clipped squared errors (an optimistic bound) instead of the
maximum (PPO's pessimistic bound, baselines ppo2 / verl compute_value_loss): the loss and its gradient
are wrong wherever the clip is active."""

import torch

from rlconform.harness.catalog.binding import LossVariants
from rlconform.harness.families.policy_loss import token_weighted
from rlconform.harness.mutants._base import mutant
from rlconform.harness.mutants._value_loss import token_mean_value_loss

EXPECTED = [("value_loss", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "value_loss.matches_reference.float32.token-mean@moderate",
    "value_loss.matches_reference.float64.token-mean@moderate",
]
binding = mutant("vl_clip_wrong_side", __doc__,
                 value_loss=LossVariants({"token-mean": token_mean_value_loss(pick=torch.minimum)},
                                         combine_metrics=token_weighted))

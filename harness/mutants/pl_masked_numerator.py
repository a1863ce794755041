"""Masked tokens in the numerator: the vanilla PPO loss sums the
per-token loss over *every* position, padding included, and divides by the number of valid tokens, so
padded tokens add to the loss and receive gradient (value and gradient both wrong)."""

import torch

from rlconform.harness.catalog.binding import LossVariants
from rlconform.harness.families import policy_loss as PL
from rlconform.harness.mutants._base import mutant

_faithful = PL.faithful_loss("vanilla")


def _vanilla(old_log_prob, log_prob, advantages, response_mask, info):
    return _faithful(old_log_prob, log_prob, advantages, torch.ones_like(response_mask), info)


_impls = {v: PL.faithful_loss(v) for v in PL.VARIANTS}
_impls["vanilla"] = _vanilla
EXPECTED = [("policy_loss", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_loss.matches_reference.float32.vanilla@moderate",
    "policy_loss.matches_reference.float64.vanilla@moderate",
]
binding = mutant("pl_masked_numerator", __doc__,
                 policy_loss=LossVariants(_impls, combine_metrics=PL.token_weighted))

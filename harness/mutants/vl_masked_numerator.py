"""Masked tokens in the value-loss numerator: the clipped value loss sums
the per-token loss over every position, padding included, and divides by the number of valid tokens, so
padded positions add to the loss and receive gradient."""

from rlconform.harness.catalog.binding import LossVariants
from rlconform.harness.families.policy_loss import token_weighted
from rlconform.harness.mutants._base import mutant
from rlconform.harness.mutants._value_loss import token_mean_value_loss

EXPECTED = [("value_loss", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "value_loss.matches_reference.float32.token-mean@moderate",
    "value_loss.matches_reference.float64.token-mean@moderate",
]
binding = mutant("vl_masked_numerator", __doc__,
                 value_loss=LossVariants({"token-mean": token_mean_value_loss(mask_numerator=False)},
                                         combine_metrics=token_weighted))

"""vf_clipfrac as a mean of micro-batch means: each micro-batch logs the
clip fraction over its own tokens and the trainer averages the micro-batches' values (verl's and SkyRL's
critic workers do exactly this), instead of Σ clipped / Σ tokens: the logged metric depends on how the
mini-batch was split."""

import math

from rlconform.harness.catalog.binding import LossVariants
from rlconform.harness.families import value_loss as VL
from rlconform.harness.mutants._base import mutant


def _mean_of_means(parts):
    keys = sorted({k for metrics, _ in parts for k in metrics})
    return {k: math.fsum(float(m.get(k, 0.0)) for m, _ in parts) / len(parts) for k in keys}


EXPECTED = [("value_loss", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "value_loss.partition_invariant.float32.token-mean@moderate",
    "value_loss.partition_invariant.float64.token-mean@moderate",
]
binding = mutant("vl_clipfrac_mean_of_means", __doc__,
                 value_loss=LossVariants({"token-mean": VL.faithful_loss("token-mean")},
                                         combine_metrics=_mean_of_means))

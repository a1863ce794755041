"""Empty micro-batch counted (SkyRL PR #1648): micro-batch token-means averaged over *all* micro-batches,
a fully masked one contributing 0 (its mean is clamped 0/1): 4 micro-batches, one fully masked, the
others mean 1.0 -> 0.75 instead of 1.0."""

import torch

from rlconform.harness.catalog.binding import AggLoss
from rlconform.harness.core import faithful as F
from rlconform.harness.mutants._base import mutant


def _loss(loss_mat, mask, mode, info):
    if mode != "token-mean":
        return F.agg_loss_micro(loss_mat, mask, mode, info)
    m = mask.to(torch.float64)
    return (loss_mat.double() * m).sum() / m.sum().clamp(min=1)


EXPECTED = [("agg_loss", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "agg_loss.partition_invariant.float32.token-mean@imbalanced_partitions",
    "agg_loss.partition_invariant.float64.token-mean@imbalanced_partitions",
]
binding = mutant("empty_micro_counted", __doc__, agg_loss=AggLoss(loss=_loss, modes=("token-mean",), micro_combine="mean", dp_combine="mean"))

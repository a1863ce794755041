"""Local denominator summed over micro-batches (verl issue #5983 / PR #1672): token-mean divided by each micro-batch's own
nnz, then summed over micro-batches: 1 token at 1.0 and 100 tokens at 2.0 give 3.0, not 1.990099."""

import torch

from rlconform.harness.catalog.binding import AggLoss
from rlconform.harness.core import faithful as F
from rlconform.harness.mutants._base import mutant


def _loss(loss_mat, mask, mode, info):
    if mode != "token-mean":
        return F.agg_loss_micro(loss_mat, mask, mode, info)
    m = mask.to(torch.float64)
    return (loss_mat.double() * m).sum() / (m.sum() + 1e-8) * info.dp_size


EXPECTED = [("agg_loss", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "agg_loss.matches_reference.float32.token-mean@imbalanced_partitions",
    "agg_loss.matches_reference.bfloat16.token-mean@imbalanced_partitions",
]
binding = mutant("local_denominator", __doc__, agg_loss=AggLoss(loss=_loss, modes=("token-mean",), micro_combine="sum", dp_combine="mean"))

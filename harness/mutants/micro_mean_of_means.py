"""Mean of micro-batch means (HF transformers PR #34191): under gradient accumulation each micro-batch
takes its own token-mean and the micro-batch losses are averaged (fully masked micro-batches skipped):
micro A 1 token of 1.0, micro B 3 tokens of 2.0 gives 1.5 instead of 7/4."""

import math

import torch

from rlconform.harness.catalog.binding import AggLoss, BatchInfo
from rlconform.harness.core import faithful as F
from rlconform.harness.mutants._base import mutant


def _loss(loss_mat, mask, mode, info: BatchInfo):
    if mode != "token-mean":
        return F.agg_loss_micro(loss_mat, mask, mode, info)
    m = mask.to(torch.float64)
    return (loss_mat.double() * m).sum() / m.sum()  # NaN for a fully masked micro-batch: skipped below


def _mean_of_nonempty(values):
    kept = [v for v in values if not math.isnan(v)]
    return math.fsum(kept) / len(kept) if kept else 0.0


EXPECTED = [("agg_loss", "matches_reference"), ("agg_loss", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "agg_loss.matches_reference.float32.token-mean@imbalanced_partitions",
    "agg_loss.partition_invariant.float32.token-mean@imbalanced_partitions",
]
binding = mutant("micro_mean_of_means", __doc__,
                 agg_loss=AggLoss(loss=_loss, modes=("token-mean",), micro_combine=_mean_of_nonempty, dp_combine="mean"))

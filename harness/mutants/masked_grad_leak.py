"""Masked tokens in the loss numerator: the loss numerator reaches masked tokens in the gradient while its value
is right: ``loss.sum() − (loss·(1−mask)).detach().sum()`` has the masked sum as its value but gives every
masked token weight 1/nnz in the optimizer step (token-mean loss [[1, 100], [1, −50]], mask [[1, 0],
[1, 0]]: value 1.0, masked gradient 0.5 instead of 0)."""

from rlconform.harness.catalog.binding import AggLoss
from rlconform.harness.core import faithful as F
from rlconform.harness.mutants._base import mutant


def _loss(loss_mat, mask, mode, info):
    if mode != "token-mean":
        return F.agg_loss_micro(loss_mat, mask, mode, info)
    v = loss_mat.to(F.compute_dtype(loss_mat.dtype))
    keep = mask.to(v.dtype)
    masked = (v * (1 - keep)).detach().nan_to_num(0.0, 0.0, 0.0)
    total = v.nan_to_num(0.0, 0.0, 0.0).sum() - masked.sum()
    return total / info.global_nnz * info.dp_size


EXPECTED = [("agg_loss", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "agg_loss.matches_reference.float32.token-mean@imbalanced_partitions",
    "agg_loss.matches_reference.float64.token-mean@imbalanced_partitions",
]
binding = mutant("masked_grad_leak", __doc__, agg_loss=AggLoss(loss=_loss, modes=("token-mean",), micro_combine="sum", dp_combine="mean"))

"""A mask read as a length: seq-mean-token-mean divides each row's masked loss sum by the
row's last valid position + 1 (``mask.cumsum(-1)`` at its end, or a response-length tensor), which is the
row's token count only for a right-padded mask. A multi-turn row whose tool-observation tokens are masked
between trainable tokens has fewer tokens than that: its token mean is diluted by the observation span.
Right-padded masks never catch it; interior masked spans (row_lengths_data's multi-turn holes) do."""

import torch

from rlconform.harness.catalog.binding import AggLoss
from rlconform.harness.core import faithful as F
from rlconform.harness.mutants._base import mutant


def _loss(loss_mat, mask, mode, info):
    if mode != "seq-mean-token-mean":
        return F.agg_loss_micro(loss_mat, mask, mode, info)
    m = mask.to(torch.float64)
    v = torch.where(mask.bool(), loss_mat.double(), torch.zeros((), dtype=torch.float64))
    pos = torch.arange(1, m.shape[-1] + 1, dtype=torch.float64)
    length = (m * pos).amax(-1)  # last valid position + 1: the count of a right-padded row
    nonempty = length > 0
    seq = (v * m).sum(-1)
    return (seq[nonempty] / length[nonempty]).sum() / info.global_nonempty_seqs * info.dp_size


EXPECTED = [("agg_loss", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "agg_loss.matches_reference.float32.seq-mean-token-mean@imbalanced_partitions",
    "agg_loss.matches_reference.float64.seq-mean-token-mean@imbalanced_partitions",
]
binding = mutant("agg_mask_as_length", __doc__, agg_loss=AggLoss(loss=_loss, micro_combine="sum", dp_combine="mean"))

"""NaN·0 at masked positions: masked positions reach arithmetic through NaN·0. A masked mean computed as
Σ(values·mask)/Σ mask, and a token-mean loss as Σ(loss·mask)/nnz: a NaN (or ±inf) at a masked position
gives NaN although no unmasked value changed — old log-prob [[0, NaN]], mask [[1, 0]] → NaN, not the
value of the unmasked token."""


from rlconform.harness.catalog.binding import AggLoss
from rlconform.harness.core import faithful as F
from rlconform.harness.mutants._base import mutant


def masked_mean(values, mask):
    v = values.to(F.compute_dtype(values.dtype))
    m = mask.to(v.dtype)
    return ((v * m).sum() / m.sum()).to(values.dtype)


def _loss(loss_mat, mask, mode, info):
    if mode != "token-mean":
        return F.agg_loss_micro(loss_mat, mask, mode, info)
    v = loss_mat.to(F.compute_dtype(loss_mat.dtype))
    return (v * mask.to(v.dtype)).sum() / info.global_nnz * info.dp_size


EXPECTED = [("masked_mean", "mask_invariant"), ("agg_loss", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "masked_mean.mask_invariant.float32.padded",
    "masked_mean.mask_invariant.float64.padded",
    "agg_loss.mask_invariant.float64.token-mean@imbalanced_partitions",
    "agg_loss.mask_invariant.float32.token-mean@imbalanced_partitions",
]
binding = mutant("nan_times_mask", __doc__, masked_mean=masked_mean,
                 agg_loss=AggLoss(loss=_loss, modes=("token-mean",), micro_combine="sum", dp_combine="mean"))

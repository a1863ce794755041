"""CP token count not reduced with padded garbage (garbage at masked positions, on CP ranks): the CP token-mean masks by multiplying,
``Σ values·mask``, before reducing the sum and nnz over the CP group. Right on clean inputs; a NaN or
±inf at a masked position (a padded log-prob) gives NaN · 0 = NaN, and the all-reduce spreads it to every
CP rank: one masked NaN on CP rank 1 turns the mean 2.0 into NaN."""

import torch
import torch.distributed as dist

from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant


def cp_masked_mean(local_values, local_mask, group):
    v = local_values.detach().to(compute_dtype(local_values.dtype))
    m = local_mask.to(v.dtype)
    t = torch.stack([(v * m).sum(), m.sum()])  # NaN · 0 = NaN at masked positions
    dist.all_reduce(t, group=group)
    return (t[0] / t[1]).to(local_values.dtype)


EXPECTED = [("cp_masked_mean", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "cp_masked_mean.mask_invariant.float32.cp2_padded",
    "cp_masked_mean.mask_invariant.float64.cp2_padded",
]
binding = mutant("cp_nan_times_mask", __doc__, cp_masked_mean=cp_masked_mean)

"""CP token count not reduced: token count not reduced over context parallelism. Each CP rank
all-reduces the masked loss *sum* over the CP group but divides by its own token count (nnz): one
sequence of 8 tokens of loss 1.0 split 4/4 over CP = 2 gives 8/4 = 2.0 instead of 1.0 (CP = 1 stays
right)."""

import torch.distributed as dist

from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant


def cp_masked_mean(local_values, local_mask, group):
    v = local_values.detach().to(compute_dtype(local_values.dtype))
    m = local_mask.to(v.dtype)
    total = (v * m).sum()
    dist.all_reduce(total, group=group)
    return (total / m.sum()).to(local_values.dtype)  # local nnz: not reduced over CP


EXPECTED = [("cp_masked_mean", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "cp_masked_mean.partition_invariant.float32.cp2_multi_turn",
    "cp_masked_mean.partition_invariant.float64.cp2_padded",
]
binding = mutant("cp_count_not_reduced", __doc__, cp_masked_mean=cp_masked_mean)

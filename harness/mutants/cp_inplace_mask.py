"""CP token count not reduced with the inputs kept ("the op must not write to its inputs"): the CP
token-mean masks the caller's values *in place* (``local_values.mul_(local_mask)``) before reducing the
masked sum and nnz over the CP group. The mean is right; the caller's tensor has its padded positions
zeroed, so a later reader of the same loss / IS-weight tensor sees different numbers (one value 5.0 at a
masked position comes back 0.0)."""

import torch
import torch.distributed as dist

from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant


def cp_masked_mean(local_values, local_mask, group):
    local_values.mul_(local_mask)  # in place on the caller's tensor
    v = local_values.detach().to(compute_dtype(local_values.dtype))
    m = local_mask.to(v.dtype)
    t = torch.stack([v.sum(), m.sum()])
    dist.all_reduce(t, group=group)
    return (t[0] / t[1]).to(local_values.dtype)


EXPECTED = [("cp_masked_mean", "non_destructive")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "cp_masked_mean.non_destructive.float32.cp2_all_on",
    "cp_masked_mean.non_destructive.float64.cp2_padded",
]
binding = mutant("cp_inplace_mask", __doc__, cp_masked_mean=cp_masked_mean)

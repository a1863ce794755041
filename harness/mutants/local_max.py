"""Local max in a vocab-parallel softmax: vocab-parallel softmax without the all-reduce of the max. Each TP rank
shifts its vocab shard by its *local* max, exponentiates, and all-reduces the sums of exp and exp²:
the terms of different shards are scaled by different factors, so Σπ² differs from the unsharded value
whenever the shards' maxima differ (TP = 1 stays right; a shard of only ``-inf`` padding gives NaN)."""

import torch
import torch.distributed as dist

from rlconform.harness.bindings.reference import _VPSumPiSquared as _ReferenceSumPiSquared
from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant


class _LocalMaxSumPiSquared(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, group):
        x = local_logits.detach().to(compute_dtype(local_logits.dtype))
        m = x.amax(dim=-1, keepdim=True)            # local max only: no all-reduce(MAX)
        e = (x - m).exp()
        s = e.sum(-1, keepdim=True)
        q = (e * e).sum(-1, keepdim=True)
        dist.all_reduce(s, group=group)
        dist.all_reduce(q, group=group)
        spp = q / (s * s)
        ctx.save_for_backward(e / s, spp)
        ctx.in_dtype = local_logits.dtype
        return spp.squeeze(-1).to(local_logits.dtype)

    backward = _ReferenceSumPiSquared.backward  # the gradient is right; only the forward's shift is not


def vocab_parallel_sum_pi_squared(local_logits, group):
    return _LocalMaxSumPiSquared.apply(local_logits, group)


EXPECTED = [("vocab_parallel_sum_pi_squared", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "vocab_parallel_sum_pi_squared.matches_reference.float32.tp2_moderate",
    "vocab_parallel_sum_pi_squared.matches_reference.float64.tp2_moderate",
]
binding = mutant("local_max", __doc__, vocab_parallel_sum_pi_squared=vocab_parallel_sum_pi_squared)

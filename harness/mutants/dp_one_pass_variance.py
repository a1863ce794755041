"""The one-pass variance E[x²] − μ² over DP ranks: the global variance from all-reduced fp32 Σx and Σx²
by the one-pass formula (Σx² − n·μ²)/(n − 1). Merging (nnz, Σx, Σx²) is the easy way to make moments
mergeable, but for values around 10⁴ with a spread of 10⁻³…1, Σx² ≈ 10⁸·n holds the variance in its last
bits: it cancels to rounding noise (or 0, or a negative number clamped to 0) and the whitened values are
off by orders of magnitude. Two passes (μ first, then Σ(x − μ)²), or Chan's merge of (n, μ, M2), do not
cancel."""

import torch
import torch.distributed as dist

from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.families.advantages import WHITEN_EPS
from rlconform.harness.mutants._base import mutant


def dp_masked_whiten(local_values, local_mask, group, shift_mean=True):
    cd = compute_dtype(local_values.dtype)
    keep = local_mask != 0
    zero = torch.zeros((), dtype=cd)
    x = torch.where(keep, local_values.detach().to(cd), zero)
    t = torch.stack([x.sum(), (x * x).sum(), keep.sum().to(cd)])
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    n = t[2]
    if float(n) == 0:
        return torch.zeros_like(x).to(local_values.dtype)
    mean = t[0] / n
    var = ((t[1] - n * mean * mean) / (n - 1)).clamp(min=0) if float(n) > 1 else zero  # one pass: cancels
    out = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return torch.where(keep, out, zero).to(local_values.dtype)


EXPECTED = [("dp_masked_whiten", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "dp_masked_whiten.matches_reference.float32.dp2_offset",
]
binding = mutant("dp_one_pass_variance", __doc__, dp_masked_whiten=dp_masked_whiten)

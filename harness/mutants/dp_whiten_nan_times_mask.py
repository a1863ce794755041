"""Garbage at masked positions in DP whitening: the masked sums are Σ x·mask, so a
NaN or inf at a padded position (NaN·0 = NaN, inf·0 = NaN) poisons the all-reduced Σx and every rank's
whitened rows. Right on clean inputs (matches_reference passes), wrong when a masked position holds
garbage (mask_invariant): `torch.where(mask, x, 0)` before summing, not `x * mask`."""

import torch
import torch.distributed as dist

from rlconform.harness.families.advantages import WHITEN_EPS
from rlconform.harness.mutants._base import mutant


def dp_masked_whiten(local_values, local_mask, group, shift_mean=True):
    x, m = local_values.double(), local_mask.double()
    t = torch.stack([(x * m).sum(), m.sum()])  # the fault: NaN·0 = NaN
    dist.all_reduce(t, group=group)
    n = t[1]
    if float(n) == 0:
        return torch.zeros_like(local_values)
    mean = t[0] / n
    d = (x - mean) * m
    ss = (d * d).sum()
    dist.all_reduce(ss, group=group)
    var = ss / (n - 1) if float(n) > 1 else torch.zeros((), dtype=torch.float64)
    out = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return torch.where(local_mask != 0, out, torch.zeros_like(out)).to(local_values.dtype)


EXPECTED = [("dp_masked_whiten", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "dp_masked_whiten.mask_invariant.float32.dp2_imbalanced",
    "dp_masked_whiten.mask_invariant.float64.dp2_imbalanced",
]
binding = mutant("dp_whiten_nan_times_mask", __doc__, dp_masked_whiten=dp_masked_whiten)

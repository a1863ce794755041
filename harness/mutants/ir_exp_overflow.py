"""exp overflow, clamped afterwards ("inf/NaN where the exact result is finite"): the token ratio is ``exp(Δ).clamp(max=e^20)`` instead of ``exp(Δ.clamp(±20))``. The value is
right, but at Δ = 100 in fp32 exp overflows to inf and the clamp's zero gradient times inf is NaN: the
gradient w.r.t. log_prob is NaN where the exact gradient is 0."""

import math

import torch

from rlconform.harness.catalog.binding import Variants
from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant


def _token(log_prob, old_log_prob, mask):
    cd = compute_dtype(log_prob.dtype)
    m = mask.bool()
    z = torch.zeros((), dtype=cd)
    delta = torch.where(m, log_prob.to(cd) - old_log_prob.to(cd), z)
    ratio = torch.exp(delta).clamp(min=math.exp(-20.0), max=math.exp(20.0))
    return torch.where(m, ratio, z).to(log_prob.dtype)


EXPECTED = [("importance_ratio", "finite_where_reference_finite")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "importance_ratio.finite_where_reference_finite.float32.token@extreme_log_ratios",
]
binding = mutant("ir_exp_overflow", __doc__, importance_ratio=Variants({"token": _token}))

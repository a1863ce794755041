"""NaN·0 in a sequence-level log-ratio sum: the sequence importance
ratio sums ``(Δ * mask)`` over the row instead of selecting the valid tokens (SkyRL 0.4.0
``compute_tis_ratio`` does this), so NaN or ±inf log-probs at padded positions make the whole row's
ratio NaN, although those positions are masked."""

import torch

from rlconform.harness.catalog.binding import Variants
from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant


def _sequence_product(log_prob, old_log_prob, mask):
    cd = compute_dtype(log_prob.dtype)
    m = mask.to(cd)
    s = ((log_prob.to(cd) - old_log_prob.to(cd)) * m).sum(-1, keepdim=True)
    return (torch.exp(s.clamp(-20.0, 20.0)) * m).to(log_prob.dtype)


EXPECTED = [("importance_ratio", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "importance_ratio.mask_invariant.float32.sequence_product@moderate",
    "importance_ratio.mask_invariant.float64.sequence_product@moderate",
]
binding = mutant("ir_nan_times_mask", __doc__, importance_ratio=Variants({"sequence_product": _sequence_product}))

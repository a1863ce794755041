"""GSPO's geometric mean over the padded length (a wrong denominator): the
sequence ratio exp(Σ_t Δ_t / n) divides the row's log-ratio sum by the padded length T instead of the
row's number of valid tokens n, so every padded row gets a ratio pulled towards 1."""

import torch

from rlconform.harness.catalog.binding import Variants
from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant


def _sequence_geometric(log_prob, old_log_prob, mask):
    cd = compute_dtype(log_prob.dtype)
    m = mask.bool()
    z = torch.zeros((), dtype=cd)
    delta = torch.where(m, log_prob.to(cd) - old_log_prob.to(cd), z)
    log_s = (delta.sum(-1, keepdim=True) / mask.shape[-1]).clamp(max=10.0)
    return torch.where(m, torch.exp(log_s), z).to(log_prob.dtype)


EXPECTED = [("importance_ratio", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "importance_ratio.matches_reference.float32.sequence_geometric@moderate",
    "importance_ratio.matches_reference.float64.sequence_geometric@moderate",
]
binding = mutant("ir_geometric_over_length", __doc__,
                 importance_ratio=Variants({"sequence_geometric": _sequence_geometric}))

"""A fused-linear backward that accumulates the LM-head weight gradient over the full
chunks only (the short last chunk's ``dlogitsᵀ @ hidden`` is never added): the log-probs, entropy and the
hidden-state gradient are right; ``d_weight`` is wrong whenever the row count is not a multiple of the
chunk size. Caught by ``fused_linear_token_stats`` ``matches_reference`` on rows one past a boundary."""

import torch

from rlconform.harness.core.faithful import fused_linear_token_stats as _faithful
from rlconform.harness.mutants._base import mutant


def fused_linear_token_stats(hidden, weight, labels, temperature, chunk_size):
    rows = hidden.reshape(-1, hidden.shape[-1]).shape[0]
    full = rows - rows % chunk_size
    if full == rows:  # no short last chunk: right
        lp, ent = _faithful(hidden, weight, labels, temperature, chunk_size)
        return lp.to(hidden.dtype), ent.to(hidden.dtype)
    h2, lab = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    lp_a, ent_a = _faithful(h2[:full], weight, lab[:full], temperature, chunk_size) if full else (h2[:0, 0], h2[:0, 0])
    lp_b, ent_b = _faithful(h2[full:], weight.detach(), lab[full:], temperature, chunk_size)  # no d_weight from the tail
    lp = torch.cat([lp_a.to(lp_b.dtype), lp_b]).reshape(hidden.shape[:-1])
    ent = torch.cat([ent_a.to(ent_b.dtype), ent_b]).reshape(hidden.shape[:-1])
    return lp.to(hidden.dtype), ent.to(hidden.dtype)


EXPECTED = [("fused_linear_token_stats", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "fused_linear_token_stats.matches_reference.float32.moderate",
    "fused_linear_token_stats.matches_reference.float64.moderate",
]
binding = mutant("fused_linear_last_chunk_grad", __doc__, fused_linear_token_stats=fused_linear_token_stats)

"""A chunked entropy whose loop stops at the last full chunk
(``range(0, n - chunk_size + 1, chunk_size)``): the rows of a short last chunk keep the buffer's zeros.
Right whenever the row count is a multiple of the chunk size; caught by ``entropy@chunked`` cases drawn
one row past a chunk boundary."""

import torch

from rlconform.harness.catalog.binding import Implementation
from rlconform.harness.core.faithful import entropy as _entropy
from rlconform.harness.mutants._base import mutant


def chunked_entropy(logits, chunk_size=2048):
    out = torch.zeros(logits.shape[:-1], dtype=logits.dtype)
    for i in range(0, logits.shape[0] - chunk_size + 1, chunk_size):
        out[i:i + chunk_size] = _entropy(logits[i:i + chunk_size])
    return out


EXPECTED = [("entropy", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "entropy.matches_reference.float32.chunked@moderate",
    "entropy.matches_reference.bfloat16.chunked@moderate",
]
binding = mutant("chunk_drops_tail", __doc__, implementations={
    "entropy": {"chunked": Implementation(chunked_entropy, chunk_arg="chunk_size")}})

"""A chunked entropy that only takes 2-D logits although its docstring allows
``[B, T, V]`` too: the per-chunk result ``[c, T]`` is written into a buffer of ``logits.shape[0]``
entries, which raises for a 3-D input (verl's ``entropy_from_logits_with_chunking`` has this shape of
code, but documents 2-D only). Caught by the rank contract of ``entropy@chunked``."""

import torch

from rlconform.harness.catalog.binding import Implementation
from rlconform.harness.core.faithful import entropy as _entropy
from rlconform.harness.mutants._base import mutant


def chunked_entropy(logits, chunk_size=2048):
    out = torch.zeros(logits.shape[0], dtype=logits.dtype)
    for i in range(0, logits.shape[0], chunk_size):
        out[i:i + chunk_size] = _entropy(logits[i:i + chunk_size])
    return out


EXPECTED = [("entropy", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "entropy.matches_reference.float32.chunked@moderate",
    "entropy.matches_reference.bfloat16.chunked@moderate",
]
binding = mutant("chunk_2d_only", __doc__, implementations={
    "entropy": {"chunked": Implementation(chunked_entropy, ranks=(2, 3), chunk_arg="chunk_size",
                                          doc="logits (batch, vocab) or (batch, seq, vocab)")}})

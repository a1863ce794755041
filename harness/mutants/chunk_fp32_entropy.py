"""A chunked entropy that writes every chunk into a float32 buffer
(``torch.zeros(n)``, as verl's ``entropy_from_logits_with_chunking`` does) while its docstring promises
the input's dtype: a float64 input comes back float32 (and fp16 / bf16 ones float32). Caught by the dtype
contract of ``entropy@chunked`` (a problem of every case: ``matches_reference`` fails with the message)."""

import torch

from rlconform.harness.catalog.binding import Implementation
from rlconform.harness.core.faithful import entropy as _entropy
from rlconform.harness.mutants._base import mutant


def chunked_entropy(logits, chunk_size=2048):
    out = torch.zeros(logits.shape[:-1])  # the default dtype: float32 whatever the input
    for i in range(0, logits.shape[0], chunk_size):
        out[i:i + chunk_size] = _entropy(logits[i:i + chunk_size])
    return out


EXPECTED = [("entropy", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "entropy.matches_reference.float64.chunked@moderate",
    "entropy.matches_reference.bfloat16.chunked@moderate",
]
binding = mutant("chunk_fp32_entropy", __doc__, implementations={
    "entropy": {"chunked": Implementation(chunked_entropy, out_dtype="input", chunk_arg="chunk_size",
                                          doc="returns entropy in the logits' dtype")}})

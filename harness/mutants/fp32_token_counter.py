"""Real shapes only: the token count kept in a float32 counter incremented once per token.

A kernel (or a Python loop over tokens) that counts unmasked tokens with ``count += 1.0`` in float32 stops
at 2^24 = 16 777 216: 2^24 + 1 rounds back to 2^24 (ties to even), so the counter saturates there. This
mutant returns exactly that value, min(nnz, 2^24) as float32, for ``masked_count``, and divides the sum by
it in ``masked_mean``. Every CI regime has at most a few thousand tokens, where it is exact; the
``real_shapes`` regime of the ``nightly`` profile (> 2^24 tokens, rows of up to 32 768) catches it: the
count is short by nnz − 2^24 ≥ 32 768 tokens and the mean too large by that fraction (~0.2 %).
"""

import torch

from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant

SATURATION = 1 << 24  # float32(2^24) + 1.0 == 2^24


def _counter(mask):
    return torch.clamp((mask != 0).sum(), max=SATURATION).to(torch.float32)


def masked_count(mask):
    return _counter(mask)


def masked_mean(values, mask):
    v = values.to(compute_dtype(values.dtype))
    keep = mask != 0
    total = torch.where(keep, v, torch.zeros((), dtype=v.dtype)).sum()
    return (total / _counter(mask).to(v.dtype)).to(values.dtype)


#: caught under the CI profile: nothing (tests/test_mutants.py checks that the CI regimes pass)
EXPECTED = []
#: caught by the nightly profile's ``real_shapes`` regime (more than 2^24 tokens)
EXPECTED_REAL_SHAPES = [("masked_count", "matches_reference"), ("masked_mean", "matches_reference")]
binding = mutant("fp32_token_counter", __doc__, masked_count=masked_count, masked_mean=masked_mean)

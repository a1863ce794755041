"""Real shapes only: a split-vocab kernel whose cross-tile partials go through a bf16 workspace.

logsumexp and entropy are computed over V in tiles of ``TILE`` = 32 768 entries, as split-V (split-K)
kernels do (Liger's fused linear cross-entropy, flash-attention's split-KV): each tile's partial sums
Σ exp(x − m) and Σ exp(x − m)·(x − m) are exact in fp32, but when V spans more than one tile the partials are
combined through a workspace of the model's dtype, bf16, so the running sums are rounded to 8 bits
after each tile. With V ≤ 4096 (every CI regime) there is one tile and the result is exact; at
V = 151 936 (5 tiles) or 128 256 (4 tiles) the sums carry a relative error up to ~4e-3: the fp32
logsumexp is off by ~1e-3 and the entropy by ~1e-3 · |mean logit − max| against a tolerance of ~1e-6.
Caught only by the ``real_shapes`` regime of the ``nightly`` profile, which is what proves that regime
earns its cost (tests/test_real_shapes.py). The workspace rounding is invisible in bf16 outputs (their
own rounding, 2^-9, is as large), so the fp32 findings are the ones that catch it.
"""

import torch

from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant

TILE = 32768


def _partials(logits):
    """(row max m, S = Σ exp(x − m), W = Σ exp(x − m)·(x − m)) over the vocab, tile by tile (a ``-inf``
    entry contributes 0 to both)."""
    x = logits.to(compute_dtype(logits.dtype))
    m = x.detach().amax(-1, keepdim=True)
    s = w = None
    for v0 in range(0, x.shape[-1], TILE):
        u = x[..., v0:v0 + TILE] - m
        e = torch.exp(u)
        ps, pw = e.sum(-1), (e * u.masked_fill(torch.isinf(u), 0.0)).sum(-1)
        if s is None:  # one tile: registers, no workspace
            s, w = ps, pw
        else:  # the cross-tile combine reads and writes the bf16 workspace
            s = (s + ps).to(torch.bfloat16).to(x.dtype)
            w = (w + pw).to(torch.bfloat16).to(x.dtype)
    return x, m.squeeze(-1), s, w


def logsumexp(logits):
    _, m, s, _ = _partials(logits)
    return (m + torch.log(s)).to(logits.dtype)


def entropy(logits):
    _, m, s, w = _partials(logits)
    return (torch.log(s) - w / s).to(logits.dtype)


#: caught under the CI profile: nothing (tests/test_real_shapes.py checks that the CI regimes pass)
EXPECTED = []
#: caught by the nightly profile's ``real_shapes`` regime (float32), tested at real V with a few rows
EXPECTED_REAL_SHAPES = [("logsumexp", "matches_reference"), ("entropy", "matches_reference")]
binding = mutant("split_vocab_bf16_workspace", __doc__, logsumexp=logsumexp, entropy=entropy)

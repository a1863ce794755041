"""NaN from masked vocab or extreme logits (TRL PR #6380, issue #7221): entropy as −Σ exp(logp)·logp. A ``-inf``
(masked) vocab entry gives 0·(−inf) = NaN; [0, −inf] -> NaN instead of 0, fp16 [65504, −65504] -> NaN
instead of 0. A nan_to_num patch would fix the value but leave the gradient NaN."""

import torch

from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.mutants._base import mutant


def entropy(logits):
    logp = torch.log_softmax(logits.to(compute_dtype(logits.dtype)), dim=-1)
    return (-(logp.exp() * logp).sum(-1)).to(logits.dtype)


EXPECTED = [("entropy", "finite_where_reference_finite")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "entropy.finite_where_reference_finite.float32.neg_inf_padded",
    "entropy.finite_where_reference_finite.bfloat16.neg_inf_padded",
]
binding = mutant("naive_entropy", __doc__, entropy=entropy)

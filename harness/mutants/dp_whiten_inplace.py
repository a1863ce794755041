"""Destroyed inputs in DP whitening: the rank writes its whitened rows back into the
caller's ``local_values`` (``values.sub_(mean).mul_(rstd)``, the in-place idiom that saves one [B, T]
buffer). The returned values are right (matches_reference passes), but the caller's rewards are gone:
a trainer that logs or re-uses them afterwards (returns = advantages + values, reward metrics) reads
whitened numbers. Caught bitwise by non_destructive."""

from rlconform.harness.bindings.reference import dp_masked_whiten as exact
from rlconform.harness.mutants._base import mutant


def dp_masked_whiten(local_values, local_mask, group, shift_mean=True):
    out = exact(local_values, local_mask, group, shift_mean)
    local_values.copy_(out.to(local_values.dtype))  # the fault: the caller's tensor is overwritten
    return out


EXPECTED = [("dp_masked_whiten", "non_destructive")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "dp_masked_whiten.non_destructive.float32.dp2_imbalanced",
    "dp_masked_whiten.non_destructive.float64.dp2_imbalanced",
]
binding = mutant("dp_whiten_inplace", __doc__, dp_masked_whiten=dp_masked_whiten)

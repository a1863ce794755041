"""A mean of per-shard means applied to advantages: each DP rank whitens its rows with its *own* mean
and variance instead of the global ones. Exact only when every rank's rows have the same statistics;
rows split [3 rows of rewards ≈ 1, 1 row ≈ 0] over DP = 2 whiten the lone row to 0 instead of about −1.7.
The same bug as SkyRL issue #1822's mean of per-shard means: the fix is to all-reduce (nnz, Σx) and then
Σ(x − μ)² over the DP group and divide once."""

from rlconform.harness.families.advantages import faithful_masked_whiten
from rlconform.harness.mutants._base import mutant


def dp_masked_whiten(local_values, local_mask, group, shift_mean=True):
    return faithful_masked_whiten(local_values, local_mask, shift_mean)  # local statistics: group unused


EXPECTED = [("dp_masked_whiten", "matches_reference"), ("dp_masked_whiten", "partition_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "dp_masked_whiten.matches_reference.float32.dp2_imbalanced",
    "dp_masked_whiten.partition_invariant.float64.dp2_imbalanced",
]
binding = mutant("dp_local_whiten", __doc__, dp_masked_whiten=dp_masked_whiten)

"""Batch metrics over the response's attention mask instead of the response mask: the advantages', returns' and
values' mean / max / min count observation tokens (multi-turn) and rows the rollout correction rejected, and
whatever sits there (0, or NaN from an upstream NaN·0) enters the logged statistic."""

from rlconform.harness.catalog.binding import Variants
from rlconform.harness.families.batch_metrics import faithful
from rlconform.harness.mutants._base import mutant

EXPECTED = [("batch_metrics", "matches_reference"), ("batch_metrics", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "batch_metrics.matches_reference.float32.critic@trainer_batches",
    "batch_metrics.mask_invariant.float32.actor@trainer_batches",
]
binding = mutant("bm_counts_masked_tokens", __doc__, batch_metrics=Variants({
    "actor": lambda batch: faithful(batch, critic=False, token_mask="attention"),
    "critic": lambda batch: faithful(batch, critic=True, token_mask="attention")}))

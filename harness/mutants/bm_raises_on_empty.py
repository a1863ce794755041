"""Batch metrics that raise on an empty selection (verl ``compute_data_metrics`` before PR #5899): the max and
min of the non-aborted rows' scores, or of the response-mask tokens' advantages, are taken with ``torch.max`` /
``torch.min`` of an empty tensor, which raises; a batch whose rows were all aborted, or all rejected by the
rollout correction, kills the step instead of logging undefined statistics."""

from rlconform.harness.catalog.binding import Variants
from rlconform.harness.families.batch_metrics import faithful
from rlconform.harness.mutants._base import mutant

EXPECTED: list = []
#: (op, property) pairs whose finding must be a ``crash`` (the engine raised on a legal input).
EXPECTED_CRASH = [("batch_metrics", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "batch_metrics.matches_reference.float32.actor@all_aborted",
    "batch_metrics.matches_reference.float32.critic@all_masked",
]
binding = mutant("bm_raises_on_empty", __doc__, batch_metrics=Variants({
    "actor": lambda batch: faithful(batch, critic=False, guarded=False),
    "critic": lambda batch: faithful(batch, critic=True, guarded=False)}))

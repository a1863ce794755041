"""A TIS weight left attached to the graph: the binding declares ``importance_ratio``
``detached`` — the truncated IS weight is computed from the training policy's old log-probs and the
rollout's, a constant for the policy gradient (verl ``compute_rollout_correction_weights``:
``rollout_is_weights.detach()``) — but the engine returns the ratio with its autograd graph, so the
policy gradient gets an extra ∂w/∂ℓ term. The value is right: only the detached contract catches it
(a ``forward_only`` binding, the only other choice before, checked no gradient at all)."""

import dataclasses

from rlconform.harness.catalog.binding import Variants
from rlconform.harness.families import importance_ratio as IR
from rlconform.harness.mutants._base import mutant

EXPECTED = [("importance_ratio", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "importance_ratio.matches_reference.float32.token@moderate",
    "importance_ratio.matches_reference.float64.sequence_tis@moderate",
]
binding = dataclasses.replace(
    mutant("ir_attached_weight", __doc__, importance_ratio=Variants({v: IR.faithful(v) for v in IR.VARIANTS})),
    detached=frozenset({"importance_ratio"}))

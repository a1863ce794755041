"""Gradient check skipped without a graph: an entropy whose output has no autograd graph (``.detach()``, or computed
under ``torch.no_grad()``). Its values are exact, so a value-only check passes every finding; an entropy
bonus built on it silently stops training. Only ``Binding(forward_only=...)`` may declare that no
gradient is part of an op's contract."""

from rlconform.harness.core import faithful as F
from rlconform.harness.mutants._base import mutant


def entropy(logits):
    return F.entropy(logits).detach()


EXPECTED = [("entropy", "matches_reference"), ("entropy", "non_destructive"),
            ("entropy", "finite_where_reference_finite")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "entropy.matches_reference.float32.moderate",
    "entropy.non_destructive.float32.moderate",
    "entropy.finite_where_reference_finite.float32.moderate",
]
binding = mutant("detached_entropy", __doc__, entropy=entropy)

"""Degenerate batch raises: whitening that raises on a legal degenerate batch. ``masked_whiten``
with the unbiased variance divides by nnz − 1, so verl's and SkyRL's ``masked_var`` raise ValueError for
0 or 1 valid tokens ("The sum of the mask is one, ..."): a micro-batch or a filtered batch with one
valid token kills the step. The reference defines both cases (all zeros; x with shift_mean=False); an
engine that raises is a ``crash`` finding."""

from rlconform.harness.families.advantages import faithful_masked_whiten
from rlconform.harness.mutants._base import mutant


def masked_whiten(values, mask, shift_mean=True):
    nnz = int((mask != 0).sum())
    if nnz == 0:
        raise ValueError("At least one element in the mask has to be 1.")
    if nnz == 1:
        raise ValueError("The sum of the mask is one, which can cause a division by zero.")
    return faithful_masked_whiten(values, mask, shift_mean)


EXPECTED: list = []
#: (op, property) pairs whose finding must be a ``crash`` (the engine raised on a legal input).
EXPECTED_CRASH = [("masked_whiten", "matches_reference")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "masked_whiten.matches_reference.float32.padded",
    "masked_whiten.matches_reference.float64.offset",
]
binding = mutant("whiten_raises_one_token", __doc__, masked_whiten=masked_whiten)

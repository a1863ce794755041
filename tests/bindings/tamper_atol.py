"""Tamper vector "on purpose": at import, this binding widens every absolute tolerance of
``rlconform.harness.core.tolerance.ATOL`` (and the relative constants) a million-fold, in place. Its
``entropy`` is half the true one. Where the tolerance is computed in the engine's process the bug passes;
the referee never imports this module, so the op must stay red."""

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F
from rlconform.harness.core import tolerance

for _table in tolerance.ATOL.values():
    for _dtype in _table:
        _table[_dtype] = 1e6
for _table in (tolerance.C, tolerance.ULP_FLOOR):
    for _dtype in _table:
        _table[_dtype] *= 1e6


def entropy(logits):
    return 0.5 * F.entropy(logits)


binding = Binding(name="tamper_atol", ops={"entropy": entropy})

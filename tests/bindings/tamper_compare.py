"""Tamper vector "on purpose": at import, this binding replaces the comparison the
properties use (``rlconform.properties.generic.compare`` and ``rlconform.harness.core.tolerance.compare``)
with one that reports every element as exact. Its ``entropy`` is half the true one. Where the comparison
runs in the engine's process the bug passes; the referee never imports this module, so the op must stay
red."""

import dataclasses

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F
from rlconform.harness.core import tolerance
from rlconform.properties import generic

_real_compare = tolerance.compare


def _always_exact(engine, reference, faithful, **kwargs):
    cmp = _real_compare(reference, reference, faithful, **kwargs)
    return dataclasses.replace(cmp) if dataclasses.is_dataclass(cmp) else cmp


generic.compare = _always_exact
tolerance.compare = _always_exact


def entropy(logits):
    return 0.5 * F.entropy(logits)


binding = Binding(name="tamper_compare", ops={"entropy": entropy})

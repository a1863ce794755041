"""Tamper vector "on purpose" against a distributed family: at import (in the engine's worker,
which owns the gloo pool, and on every rank) this binding replaces the comparison the properties use
(``rlconform.properties.generic.compare`` and ``rlconform.harness.core.tolerance.compare``) with one that
reports every element as exact. Its ``cp_masked_mean`` is half the true CP token-mean. Where the ranks'
outputs are compared in the engine's worker the bug passes; the referee never imports this module, so the
op must stay red."""

import dataclasses

from rlconform.harness.bindings.reference import cp_masked_mean as _cp_masked_mean
from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import tolerance
from rlconform.properties import generic

_real_compare = tolerance.compare


def _always_exact(engine, reference, faithful, **kwargs):
    cmp = _real_compare(reference, reference, faithful, **kwargs)
    return dataclasses.replace(cmp) if dataclasses.is_dataclass(cmp) else cmp


generic.compare = _always_exact
tolerance.compare = _always_exact


def cp_masked_mean(local_values, local_mask, group):
    return 0.5 * _cp_masked_mean(local_values, local_mask, group)


binding = Binding(name="tamper_distributed_compare", ops={"cp_masked_mean": cp_masked_mean})

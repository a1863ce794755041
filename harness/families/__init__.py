"""Op families: each module here is one family, in one place (PyTorch OpInfo style).

A family module declares, together:

* its catalog entries (:class:`~rlconform.harness.core.opinfo.OpInfo`: signature, dtypes, regimes,
  variants, which generic properties apply, the float64 reference in :mod:`rlconform.reference`);
* its input strategy (hypothesis, built from :mod:`rlconform.harness.core.strategies`);
* its engine-call adapter and its dtype-faithful fp32 path, joined in ``evaluate(binding, case) ->
  Evaluation`` (:mod:`rlconform.harness.core.evaluation`), which the generic properties judge
  (:mod:`rlconform.properties.generic`); distributed families are evaluated on gloo ranks by
  :mod:`rlconform.distributed_tests` instead (``evaluate`` is ``None``).

and ends with ``FAMILY = OpFamily(...)``. Every module of this package that defines ``FAMILY`` is
collected by :func:`all_families` (no list to edit): adding a family is adding its module (and its
reference, bindings and mutants). Families sit on the core: they import the reference, harness.core
and harness.workers (vocabulary, tolerance, guards, faithful, strategies), never the catalog, a binding,
properties, distributed_tests or the layers above.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable

from rlconform.harness.core.opinfo import OpInfo


@dataclasses.dataclass(frozen=True)
class OpFamily:
    """One op family: ``name``; ``ops`` (its catalog entries); ``strategy(op: OpInfo, dtype, regime)``
    -> hypothesis strategy of a case's ``inputs`` dict; ``evaluate(binding, case)`` -> Evaluation (None
    for distributed families); ``doc``: one line for ``rlconform list-ops``; ``trigger``: see below."""

    name: str
    ops: tuple[OpInfo, ...]
    strategy: Callable[[OpInfo, str, str], Any]
    evaluate: Callable[..., Any] | None = None
    doc: str = ""
    #: position in the catalog (reports list ops in catalog order)
    order: int = 100
    #: ``trigger(case, clauses, kind) -> str | None``: the feature of a failing case's shrunk input in a
    #: maintainer's words, read from this family's own inputs (None: the generic reading of
    #: :func:`rlconform.harness.core.triggers.trigger` decides)
    trigger: Callable[..., Any] | None = None


def all_families() -> tuple[OpFamily, ...]:
    """Every family module of this package, in module-name order (cached by the import system)."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        family = getattr(module, "FAMILY", None)
        if isinstance(family, OpFamily):
            found.append(family)
    return tuple(sorted(found, key=lambda f: (f.order, f.name)))

"""Shared helper: a mutant is the reference binding with some ops replaced."""

from __future__ import annotations

from rlconform.harness.bindings.reference import binding as reference
from rlconform.harness.catalog.binding import Binding


def mutant(name: str, doc: str, implementations=None, **ops) -> Binding:
    """The reference binding under ``mutants.<name>`` with ``ops`` replaced (every op stays, so unaffected ops
    must pass); ``implementations`` (op -> {name -> Implementation}) replaces the reference's alternative
    implementations of those ops."""
    merged = dict(reference.ops)
    merged.update(ops)
    impls = {op: dict(v) for op, v in reference.implementations.items()}
    for op, v in (implementations or {}).items():
        impls.setdefault(op, {}).update(v)
    return Binding(name=f"mutants.{name}", ops=merged, notes={"mutant": doc}, implementations=impls)

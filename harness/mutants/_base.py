"""Shared helper: a mutant is the reference binding with some ops replaced."""

from __future__ import annotations

from rlconform.harness.binding import Binding
from rlconform.harness.bindings.reference import binding as reference


def mutant(name: str, doc: str, **ops) -> Binding:
    """The reference binding under ``mutants.<name>`` with ``ops`` replaced (and only those kept
    when ``only=True`` would hide nothing: every op stays, so unaffected ops must pass)."""
    merged = dict(reference.ops)
    merged.update(ops)
    return Binding(name=f"mutants.{name}", ops=merged, notes={"mutant": doc})

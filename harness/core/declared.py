"""What an engine does on purpose: declared conventions, preconditions and guards (issue 20 §2).

Some differences from the reference are an engine's documented choice, not a defect. A binding declares
each as a :class:`Declared` with the reason and the engine's source line (``path:line`` relative to the
engine package), and the harness then checks it *as declared*:

* ``convention`` — the engine computes something else on purpose (verl's SAPO always aggregates
  ``seq-mean-token-mean``; verl gives a group of one sample μ := 0, σ := 1): the reference follows it (the
  binding wires it where the op family reads it, e.g.
  :attr:`~rlconform.harness.core.contracts.LossVariants.agg_modes`, or names the reference's keyword
  arguments in ``reference``, read by :func:`followed`), so an engine that stops following it fails;
* ``precondition`` — something the engine's callers guarantee (rewards are zero outside the response
  mask): the checks do not violate it (``mask_invariant`` writes no garbage into the ``inputs`` named);
* ``guard`` — a clean error on a degenerate input the engine rejects on purpose (verl's ``masked_var`` on
  ≤ 1 valid token raises ``ValueError``): where ``when(inputs)`` holds, raising ``raises`` with a message
  matching ``match`` is the declared behaviour; raising anywhere else, or another error, stays a crash.

Declared items are listed in the report's "Conventions and guards" section, never as defects. An
undeclared difference stays a defect. Core layer: imports nothing of the project.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

KINDS = ("convention", "precondition", "guard")


@dataclasses.dataclass(frozen=True)
class Declared:
    """One declared convention, precondition or guard of an engine.

    ``name``: a short id (unique in the binding); ``kind``: one of :data:`KINDS`; ``ops``: the catalog ops it
    concerns; ``variants``: the catalog variants it concerns (empty: every variant); ``what``: the
    behaviour in one sentence; ``reason``: why the engine does it; ``source``: the engine's ``path:line``.
    Guards: ``when(case) -> bool`` the trigger, read from a case (its ``property`` and ``inputs``); ``raises`` the exception
    type name; ``match`` a regular expression its message matches. Preconditions: ``inputs`` the case
    inputs whose masked positions the callers keep at zero. Conventions: ``reference`` the keyword arguments
    (name, value) the family passes its reference so that it follows the convention (e.g.
    ``(("singleton", "raw"),)`` for :func:`rlconform.reference.outcome_advantage`). Raises ValueError when
    malformed.
    """

    name: str
    kind: str
    ops: tuple[str, ...]
    what: str
    reason: str
    source: str
    variants: tuple[str, ...] = ()
    when: Callable[[Any], bool] | None = None
    raises: str = ""
    match: str = ""
    inputs: tuple[str, ...] = ()
    reference: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"declared {self.name!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not (self.name and self.ops and self.what and self.reason and self.source):
            raise ValueError(f"declared {self.name!r}: name, ops, what, reason and source are required")
        if self.kind == "guard" and not (self.when and self.raises and self.match):
            raise ValueError(f"declared guard {self.name!r}: when, raises and match are required")
        if self.kind == "precondition" and not self.inputs:
            raise ValueError(f"declared precondition {self.name!r}: inputs is required")
        if self.reference and self.kind != "convention":
            raise ValueError(f"declared {self.name!r}: only a convention names reference arguments")

    def concerns(self, op: str, variant: str | None) -> bool:
        """Whether it applies to ``op`` (and catalog ``variant``, None for an op without variants)."""
        return op in self.ops and (not self.variants or variant in self.variants)

    def row(self) -> dict:
        """Its JSON form for report.json (``when`` is code: described by ``what``)."""
        return {"name": self.name, "kind": self.kind, "ops": list(self.ops), "variants": list(self.variants),
                "what": self.what, "reason": self.reason, "source": self.source,
                **({"raises": self.raises, "match": self.match} if self.kind == "guard" else {}),
                **({"inputs": list(self.inputs)} if self.kind == "precondition" else {}),
                **({"reference": {k: v for k, v in self.reference}} if self.reference else {})}


def _variant(regime: str) -> str | None:
    return regime.split("@", 1)[0] if "@" in regime else None


def matching_guard(declared, case, error_type: str, message: str) -> Declared | None:
    """The declared guard that covers an engine error ``error_type: message`` on ``case`` (a Case: ``op``,
    ``regime``, ``property``, ``inputs``), or None: it concerns the op and variant, its trigger holds on the
    case and the error is the declared one."""
    for d in declared or ():
        if d.kind != "guard" or not d.concerns(case.op, _variant(case.regime)):
            continue
        if d.raises == error_type and re.search(d.match, message) and d.when(case):
            return d
    return None


def preconditions(declared, op: str, regime: str) -> list[Declared]:
    """The declared preconditions that concern ``op`` under ``regime``."""
    return [d for d in declared or () if d.kind == "precondition" and d.concerns(op, _variant(regime))]


def followed(declared, op: str, regime: str) -> dict:
    """The reference keyword arguments of the declared conventions that concern ``op`` under ``regime``.
    A second implementation (``rloo+vectorized@…``) is held to the conventions of its variant (``rloo``):
    the engine's convention is the variant's, whichever implementation computes it. Two conventions that
    set one argument differently raise ValueError."""
    variant = _variant(regime or "")
    plain = variant.split("+", 1)[0] if variant else None
    out: dict = {}
    for d in declared or ():
        if d.kind != "convention" or not d.reference or not d.concerns(op, plain):
            continue
        for k, v in d.reference:
            if k in out and out[k] != v:
                raise ValueError(f"declared conventions disagree on the reference's {k!r}: {out[k]!r} vs {v!r}")
            out[k] = v
    return out

"""What an engine does on purpose: declared conventions, preconditions and guards.

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
* a declared *write* (a ``precondition`` with a ``caller``, or a ``convention`` with ``writes``): the engine
  writes into a tensor it was handed on purpose (verl's ``_VocabParallelEntropy.backward`` reuses the logits
  as scratch, its only caller clones them first; Megatron's ``calculate_predicted_logits`` subtracts the
  row max in place), so a ``non_destructive`` finding that shows exactly that write is the declared
  behaviour, not a defect (:func:`covering_write`). It is checked as declared: ``evidence`` (regular
  expressions, in order) must still be found in the installed engine's source — the caller's (``caller``,
  ``path:line``) for a precondition (the clone before the backward, Σπ² before the entropy), the writer's
  (``source``) for a convention — read at run time from the package the run imports (a fork's checkout:
  :func:`verify`, recorded as ``holds`` / ``evidence`` in ``report.json``); and the finding must show the
  declared write only: the tensors in ``writes``, changed in the declared ``phase`` (``backward``: the
  forward stays non-destructive), by the declared ``writer``. A caller that drops the clone, or a write
  anywhere else, makes the finding a ``destructive`` defect again;
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
#: the pass a declared write happens in
PHASES = ("forward", "backward")


@dataclasses.dataclass(frozen=True)
class Declared:
    """One declared convention, precondition or guard of an engine.

    ``name``: a short id (unique in the binding); ``kind``: one of :data:`KINDS`; ``ops``: the catalog ops it
    concerns; ``variants``: the catalog variants it concerns (empty: every variant); ``what``: the
    behaviour in one sentence; ``reason``: why the engine does it; ``source``: the engine's ``path:line``.
    Guards: ``when(case) -> bool`` the trigger, read from a case (its ``property`` and ``inputs``); ``raises`` the exception
    type name; ``match`` a regular expression its message matches. Preconditions: ``inputs`` the case
    inputs whose masked positions the callers keep at zero; ``mask_layout`` where the callers put each row's
    valid tokens (:data:`rlconform.harness.core.mask_layout.LAYOUTS`: SkyRL right-aligns its response mask),
    in which the family draws the mask. Conventions: ``reference`` the keyword arguments
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
    writes: tuple[str, ...] = ()
    phase: str = ""
    writer: str = ""
    evidence: tuple[str, ...] = ()
    caller: str = ""
    hazard: str = ""
    mask_layout: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"declared {self.name!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not (self.name and self.ops and self.what and self.reason and self.source):
            raise ValueError(f"declared {self.name!r}: name, ops, what, reason and source are required")
        if self.kind == "guard" and not (self.when and self.raises and self.match):
            raise ValueError(f"declared guard {self.name!r}: when, raises and match are required")
        if self.kind == "precondition" and not (self.inputs or self.caller or self.mask_layout):
            raise ValueError(f"declared precondition {self.name!r}: inputs, a caller or a mask_layout is required")
        if self.mask_layout:
            from rlconform.harness.core.mask_layout import LAYOUTS

            if self.kind != "precondition" or self.mask_layout not in LAYOUTS:
                raise ValueError(f"declared {self.name!r}: mask_layout is a precondition's, one of "
                                 f"{', '.join(LAYOUTS)}; got {self.mask_layout!r}")
        if self.caller and self.kind != "precondition":
            raise ValueError(f"declared {self.name!r}: only a precondition names a caller")
        if self.writes:
            if self.kind not in ("precondition", "convention") or self.phase not in PHASES or not \
                    (self.writer and self.evidence):
                raise ValueError(f"declared write {self.name!r}: a precondition or convention with phase (one of "
                                 f"{', '.join(PHASES)}), writer and evidence")
            if self.kind == "precondition" and not self.caller:
                raise ValueError(f"declared write {self.name!r}: a precondition names the caller that keeps it")
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
                **({"mask_layout": self.mask_layout} if self.mask_layout else {}),
                **({"reference": {k: v for k, v in self.reference}} if self.reference else {}),
                **({"writes": list(self.writes), "phase": self.phase, "writer": self.writer,
                    "caller": self.caller, "hazard": self.hazard, **self.verify()} if self.writes else {})}

    def verify(self, roots: dict | None = None) -> dict:
        """Whether a declared write still holds in the installed engine: ``{"holds": bool, "evidence": str}``.
        Reads the file of ``caller`` (a precondition) or ``source`` (a convention) from the package the
        process imports (:func:`package_dir`; ``roots``: top package -> folder, to read another checkout)
        and finds each of ``evidence`` in order, from the function that holds the cited line on; the
        evidence names the line each was found at, or what is missing."""
        where = self.caller or self.source
        path, _, line = where.rpartition(":")
        text = read_source(path, roots)
        if text is None:
            return {"holds": False, "evidence": f"{path} not found in the installed engine"}
        lines = text.splitlines()
        start, end = _function_span(lines, int(line) if line.isdigit() else 1)
        pos = sum(len(x) + 1 for x in lines[:start])
        stop = sum(len(x) + 1 for x in lines[:end])
        found = []
        for pattern in self.evidence:
            m = re.compile(pattern, re.M).search(text, pos, stop)
            if not m:
                return {"holds": False, "evidence": f"{path}: no {pattern!r} in lines {start + 1}-{end}"
                                                    + (f" (found: {'; '.join(found)})" if found else "")}
            n = text.count("\n", 0, m.start()) + 1
            found.append(f":{n} {lines[n - 1].strip()[:80]}")
            pos = m.end()
        return {"holds": True, "evidence": f"{path}" + "; ".join(found)}


def package_dir(top: str, roots: dict | None = None) -> str | None:
    """The folder holding top-level package ``top`` as this process would import it (an imported one's,
    else the first on ``sys.path``), without importing it (Megatron-core's ``__init__`` needs Triton);
    ``roots``: top -> the folder that holds the package, read instead."""
    import importlib.machinery
    import os
    import sys

    if roots and top in roots:
        return os.path.join(roots[top], top)
    mod = sys.modules.get(top)
    paths = list(getattr(mod, "__path__", None) or [])
    if not paths:
        spec = importlib.machinery.PathFinder.find_spec(top)
        paths = list((spec.submodule_search_locations or []) if spec else [])
    return paths[0] if paths else None


def read_source(path: str, roots: dict | None = None) -> str | None:
    """The text of the engine file ``path`` (relative to its top package's parent: ``verl/utils/x.py``) in the
    installed package (:func:`package_dir`), or None when absent."""
    import os

    top, _, rest = path.partition("/")
    base = package_dir(top, roots)
    try:
        with open(os.path.join(base, rest), encoding="utf-8") as fh:
            return fh.read()
    except (OSError, TypeError):
        return None


def _function_span(lines: list[str], line: int) -> tuple[int, int]:
    """``(start, end)``: 0-based index of the ``def`` that holds 1-based ``line`` and the index past its body
    (the next ``def`` / ``class`` indented no deeper); the whole file when no ``def`` holds it."""
    line = max(1, min(line, len(lines)))
    for i in range(line - 1, -1, -1):
        m = re.match(r"(\s*)(?:async\s+)?def\s", lines[i])
        if m:
            indent = len(m[1])
            for j in range(i + 1, len(lines)):
                n = re.match(r"(\s*)(?:async\s+def|def|class)\s", lines[j])
                if n and len(n[1]) <= indent:
                    return i, j
            return i, len(lines)
    return 0, len(lines)


def covering_write(rows, finding: dict, clauses) -> dict | None:
    """The declared write (a row of ``report.json``'s ``engine.declared``, :meth:`Declared.row`) that covers a
    ``non_destructive`` ``finding`` whose failure clauses are ``clauses`` (``mutation`` clauses, fields ``label``
    = the tensor, ``phase``; :mod:`rlconform.harness.core.failure`), or None: it concerns the op and
    variant, it holds in the installed engine (``holds``, :meth:`Declared.verify`), the finding is located at its
    ``writer`` (the engine function or the frame it writes through, ``via``), and every change is to a tensor it
    ``writes`` in its ``phase`` (a forward write is also seen after the backward; a backward write must leave
    the forward alone). Anything else — another tensor, a forward change of a backward write, a clause that names
    no tensor, a crash — is not covered."""
    if finding.get("property") != "non_destructive" or finding.get("status") not in ("discrepancy", "xfail"):
        return None  # xfail: a ledger that lists the write (its findings stay declared, not defects)
    site = finding.get("engine_function") or {}
    at = {site.get("function"), (site.get("via") or {}).get("function")} - {None}
    regime = finding.get("regime") or ""
    changes = [(c.label, c.phase) if c.kind == "mutation" else ("", "") for c in clauses or ()]
    if not changes or any(not (name and phase) for name, phase in changes):
        return None  # a clause that is no change of a named tensor (a missing graph, a value): not covered
    for d in rows or ():
        if not d.get("writes") or not d.get("holds") or finding.get("op") not in d.get("ops", ()):
            continue
        if d.get("variants") and _variant(regime) not in d["variants"]:
            continue
        if d.get("writer") not in at:
            continue
        allowed = {"forward": ("forward", "backward"), "backward": ("backward",)}[d["phase"]]
        if all(name in d["writes"] and phase in allowed for name, phase in changes):
            if d["phase"] == "forward" and not any(p == "forward" for _, p in changes):
                continue  # declared in the forward, seen only after the backward: another write
            return d
    return None


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


def zero_where_masked(declared, op: str, regime: str) -> tuple[set[str], "Declared | None"]:
    """(the inputs the engine's callers keep zero at masked positions, the first such precondition) of the
    declared preconditions that concern ``op`` under ``regime``; ``(set(), None)`` when none does. A family
    draws no other value and writes no garbage there: an example must be one the callers can pass."""
    kept = [d for d in preconditions(declared, op, regime) if d.inputs]
    return {k for d in kept for k in d.inputs}, (kept[0] if kept else None)


def mask_layout(declared, op: str, regime: str) -> tuple[str, str]:
    """(layout, the precondition's name) of the declared mask layout that concerns ``op`` under ``regime``, or
    ``("", "")``."""
    for d in preconditions(declared, op, regime):
        if d.mask_layout:
            return d.mask_layout, d.name
    return "", ""


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

"""A failure as data: the clauses a property's judgment produces, and the one renderer of their message.

A failing example is described by a list of :class:`Clause` records (one per output, difference, mutation or
problem that failed), not by prose. The generic properties (:mod:`rlconform.properties.generic`) build them
from the numbers they compare; a finding of ``report.json`` carries them as ``failure.clauses`` (with the
engine's crash, if any, as ``failure.crash``); and the finding's ``message`` is :func:`render` of them.
Severity, triage, root causes and diffs read the fields (:mod:`rlconform.harness.report.failure_fields`);
only this module turns them into English.

==============  ==================================================================================
clause kind     fields it carries (beside ``label``, ``quantity``, ``dtype``, ``layout``)
==============  ==================================================================================
``value``       ``engine`` vs ``exact`` at flat ``index``: ``abs_err``, ``rel_err``, ``ulp_err`` (of that
                element), ``tolerance`` there and ``ratio`` (error / tolerance)
``nonfinite``   ``engine`` NaN / ±inf where ``exact`` is finite, at flat ``index``
``difference``  two runs of the same data: ``engine`` (this run, ``label``) vs ``other`` (the base run,
                ``other_label``) at flat ``index``, ``exact`` the reference there, ``tolerance`` the
                allowed difference, ``ratio``
``contract``    an input rank the implementation's docstring allows raised: ``rank``, ``error_type``, ``frame``
                (the deepest engine frame of its exception: ``{"function", "module", "file", "line"}``, or None)
``problem``     something expected was absent or malformed (``text``, the family's sentence; ``what``, one of
                :data:`PROBLEMS`, when the family names it; ``key``, the output of a lost metric)
``mutation``    an input or a tensor saved for backward changed: ``label`` the tensor, ``phase`` the pass it
                was seen changed after (``forward`` / ``backward``), ``by_op`` another op whose pass
                changed it (verl's entropy backward before Σπ²; ``""``: the op checked), ``evidence``
                (:data:`EVIDENCE`: its bits changed, a producer that saved it could not backprop, a value
                read from it afterwards differs), ``versions`` (its ``_version`` before and after),
                ``changed`` (elements changed) and one of them at ``index``: ``other`` before, ``engine``
                after; ``text``
``metric``      a metric key lost, printed or retyped on its way to the final dict (``text``): ``key`` the
                emitted key that never reached it (``""``: a key that reached it retyped), ``printed`` the line the engine
                printed instead of logging it (``""``: none)
==============  ==================================================================================

``quantity`` says what the compared number is: ``value`` (an output of the op), ``gradient`` (a gradient
w.r.t. an input), ``metric`` (a logged metric), or ``""`` where the clause is about no single number.
``layout`` (or ``None``) gives the partition of the run the clause describes: ``{"parts": "micro-batches" |
"shards" | "DP ranks" | "CP ranks", "nnz": [tokens per part]}`` (``"rows": [...]``, the parts' row ranges,
instead of ``nnz`` where a family counts rows). ``masked`` (or ``None``) is the value written at the masked positions of the run
the clause describes (``mask_invariant``'s garbage: NaN, ±inf, 1e30).

A family names its runs in its labels (``dp2: DP rank 0, tokens per DP rank [1, 0]``, ``masked = nan: loss``,
``micro-batches (nnz) [1, 2]: value``); a clause made without ``layout`` / ``masked`` gets them from that
grammar once, here (:func:`label_fields`), so no reader parses a label or a message for them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

#: the kinds of :class:`Clause` (module table)
KINDS = ("value", "nonfinite", "difference", "contract", "problem", "mutation", "metric")
#: what a compared number is
QUANTITIES = ("value", "gradient", "metric", "")
#: what a ``problem`` clause says is wrong without a number to compare: a gradient the contract requires is absent
#: (no autograd graph, or backward reached no input), an output is absent (missing, of the wrong shape or type, or
#: nothing to compare), a metric was lost on its way to the final dict, a gradient flows where the binding declares
#: none (a weight declared detached), an output's dtype is not the one the implementation documents (its numbers,
#: compared beside it, decide how much that matters)
PROBLEMS = ("missing gradient", "missing output", "lost metric", "unexpected gradient", "wrong dtype")
#: the version of the failure record this rlconform writes (``failure.version`` in report.json): a record of an
#: earlier version (none) may hold clauses without the fields added since (a mutation's phase, a lost metric's
#: key, a problem's ``what``), which :mod:`rlconform.harness.report.failure_fields` reads from their sentences
RECORD_VERSION = 2
#: how a ``mutation`` clause knows the tensor changed: its bits or version counter, a producer that saved it for
#: backward could not backprop, a value another op read from it afterwards differs
EVIDENCE = ("changed", "saved", "read after")
#: the passes a ``mutation`` is seen after
PHASES = ("forward", "backward")


@dataclasses.dataclass
class Clause:
    """One failing part of one example (module table). Numbers are Python floats (NaN / ±inf allowed);
    ``index`` is the flat index of the element described, or None."""

    kind: str
    label: str = ""
    quantity: str = ""
    engine: float | None = None
    exact: float | None = None
    index: int | None = None
    abs_err: float | None = None
    rel_err: float | None = None
    ulp_err: float | None = None
    tolerance: float | None = None
    ratio: float | None = None
    dtype: str | None = None
    other: float | None = None
    other_label: str | None = None
    layout: dict | None = None
    rank: int | None = None
    error_type: str | None = None
    text: str = ""
    what: str = ""
    phase: str = ""
    by_op: str = ""
    evidence: str = ""
    versions: list | None = None
    changed: int | None = None
    masked: float | None = None
    key: str = ""
    printed: str = ""
    frame: dict | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown clause kind {self.kind!r}; one of {', '.join(KINDS)}")
        if self.what and self.what not in PROBLEMS:
            raise ValueError(f"unknown problem {self.what!r}; one of {', '.join(PROBLEMS)}")
        if self.phase and self.phase not in PHASES or self.evidence and self.evidence not in EVIDENCE:
            raise ValueError(f"unknown mutation phase {self.phase!r} or evidence {self.evidence!r}")
        if self.kind in ("value", "nonfinite", "difference") and (self.layout is None or self.masked is None):
            layout, masked = label_fields(self.label, self.other_label or "")
            self.layout = self.layout if self.layout is not None else layout
            self.masked = self.masked if self.masked is not None else masked

    def __str__(self) -> str:
        return render_clause(self)

    def to_json(self) -> dict:
        """The clause as JSON-safe fields: non-finite floats as the strings ``"nan"``, ``"inf"``, ``"-inf"``;
        fields at their default left out."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v == f.default and f.name != "kind" or v is None:
                continue
            if isinstance(v, float) and not math.isfinite(v):
                v = repr(v)
            out[f.name] = v
        return out

    @classmethod
    def from_json(cls, doc: dict) -> "Clause":
        """Inverse of :meth:`to_json`; raises ValueError on an unknown kind or field, or a number field that
        is not a number."""
        if not isinstance(doc, dict):
            raise ValueError(f"a failure clause must be an object, not {type(doc).__name__}")
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(doc) - set(names)
        if unknown:
            raise ValueError(f"unknown failure clause field(s) {sorted(unknown)}")
        kw = {}
        for k, v in doc.items():
            if k in _FLOATS:
                v = _number(v, k)
            kw[k] = v
        return cls(**kw)


_FLOATS = ("engine", "exact", "abs_err", "rel_err", "ulp_err", "tolerance", "ratio", "other", "masked")

#: a family's label of a partitioned run: the parts and their counts (``tokens per DP rank [1, 0]``,
#: ``micro-batches (nnz) [0, 1]``, ``shards (rows) [[[0, 2]]]``)
_PARTS = re.compile(r"(?P<what>micro-batches|tokens per DP rank|tokens per CP rank|shards|DP ranks|CP ranks)"
                    r"(?P<between>[^\[\n]*)(?P<list>\[[\[\]0-9, ]*\])")
_PART_NAMES = {"micro-batches": "micro-batches", "tokens per DP rank": "DP ranks", "DP ranks": "DP ranks",
               "tokens per CP rank": "CP ranks", "CP ranks": "CP ranks", "shards": "shards"}
#: a family's label of a run with garbage at the masked positions (``masked = nan: loss``)
_MASKED = re.compile(r"^(?:[^\n]*?(?::|,) )?masked = (?P<g>nan|[-+]?inf|[-+0-9.e]+)(?:[: ]|$)")


def counts(layout: dict | None) -> list[int]:
    """The token counts of a ``layout``'s parts, flattened (``[]``: none; row ranges are not token counts)."""
    out, pending = [], [(layout or {}).get("nnz") or []]
    while pending:
        x = pending.pop()
        if isinstance(x, list):
            pending += x
        elif isinstance(x, int):
            out.append(x)
    return out


def label_fields(*labels: str) -> tuple[dict | None, float | None]:
    """(``layout``, ``masked``) of the first of ``labels`` that names them in the families' grammar (module
    docstring), each None when none does. Row ranges (``(rows)``) give ``{"parts", "rows"}``."""
    layout = masked = None
    for label in labels:
        m = _PARTS.search(label or "") if layout is None else None
        if m:
            try:
                parts = json.loads(m["list"])
            except ValueError:
                parts = None
            if isinstance(parts, list):
                rows = "(rows)" in m["between"]
                layout = {"parts": _PART_NAMES[m["what"]], ("rows" if rows else "nnz"): parts}
        g = _MASKED.search(label or "") if masked is None else None
        if g:
            try:
                masked = float(g["g"])
            except ValueError:
                pass
    return layout, masked


def _number(v, name: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise ValueError(f"failure clause field {name!r} is not a number: {v!r}")


def value(label: str, quantity: str, *, engine: float, exact: float, index: int, abs_err: float,
          rel_err: float, ulp_err: float, tolerance: float, ratio: float, dtype: str | None = None,
          layout: dict | None = None) -> Clause:
    """A ``value`` clause (an engine number against the exact one, beyond its tolerance)."""
    return Clause("value", label, quantity, engine=float(engine), exact=float(exact), index=int(index),
                  abs_err=float(abs_err), rel_err=float(rel_err), ulp_err=float(ulp_err),
                  tolerance=float(tolerance), ratio=float(ratio), dtype=dtype, layout=layout)


def text(kind: str, message: str, label: str = "") -> Clause:
    """A ``problem`` / ``mutation`` / ``metric`` clause: the family's own sentence."""
    return Clause(kind, label, text=str(message))


def mutation(tensor: str, phase: str, sentence: str, *, by_op: str = "", evidence: str = "changed",
             versions=None, changed: int | None = None, index: int | None = None, before: float | None = None,
             after: float | None = None) -> Clause:
    """A ``mutation`` clause: ``tensor`` seen changed after the ``phase`` pass (of ``by_op``, another op, when
    given), known by ``evidence`` (:data:`EVIDENCE`), with the family's sentence; ``versions`` ``[before,
    after]`` of its version counter, ``changed`` elements, one of them at flat ``index`` (``before`` ->
    ``after``) when known."""
    return Clause("mutation", tensor, text=str(sentence), phase=phase, by_op=by_op, evidence=evidence,
                  versions=[int(v) for v in versions] if versions else None, changed=changed, index=index,
                  other=None if before is None else float(before), engine=None if after is None else float(after))


def problem(what: str, message: str, key: str = "") -> Clause:
    """A ``problem`` clause that names what is absent (one of :data:`PROBLEMS`) beside the family's sentence;
    ``key``: the output a ``lost metric`` names (``pg_loss (mean)``)."""
    return Clause("problem", text=str(message), what=what, key=key)


def crash_record(exc_type: str, where: str, text: str) -> dict:
    """The ``failure`` record of a crash without clauses: the exception's type, where it was raised, the first line
    of its text; current :data:`RECORD_VERSION`."""
    first = ((text or "").strip().splitlines() or [""])[0][:500]
    return {"clauses": [], "crash": {"type": exc_type, "where": where, "text": first}, "version": RECORD_VERSION}


def as_clause(item, kind: str = "problem") -> Clause:
    """``item`` as a clause: a :class:`Clause` as it is, a string as a ``kind`` clause holding it."""
    return item if isinstance(item, Clause) else text(kind, str(item))


def _g(x: float | None) -> str:
    return "nan" if x is None else f"{x:.3g}"


def render_clause(c: Clause) -> str:
    """The one English line of a clause (what ``report.json``'s ``message`` holds, line by line)."""
    if c.kind == "value":
        head = f"engine {c.engine!r} vs reference {c.exact!r} at flat index {c.index}"
        if not math.isfinite(c.engine) or not math.isfinite(c.exact):
            body = f"{head}: tolerance {_g(c.tolerance)}"
        else:
            parts = [f"abs err {_g(c.abs_err)}"]
            if c.exact != 0:
                parts += [f"rel err {_g(c.rel_err)}", f"{_g(c.ulp_err)} ulp"]
            body = f"{head}: " + ", ".join(parts) + f", tolerance {_g(c.tolerance)}"
        return f"{c.label}: {body}" if c.label else body
    if c.kind == "nonfinite":
        return (f"{c.label}: engine {c.engine!r} where the reference is finite ({c.exact!r}) "
                f"at flat index {c.index}")
    if c.kind == "difference":
        return (f"{c.label} = {c.engine!r} vs {c.other_label} = {c.other!r} at flat index {c.index} "
                f"(reference {c.exact!r}, allowed difference {_g(c.tolerance)}, {_g(c.ratio)}×)")
    return c.text


def render(clauses) -> str:
    """The message of a failing example: its clauses' lines, in order."""
    return "\n".join(render_clause(c) for c in clauses)


def clauses_to_json(clauses) -> list[dict]:
    return [c.to_json() for c in clauses]


def clauses_from_json(docs) -> list[Clause]:
    """Raises ValueError when ``docs`` is not a list of clause objects."""
    if not isinstance(docs, list):
        raise ValueError(f"failure clauses must be a list, not {type(docs).__name__}")
    return [Clause.from_json(d) for d in docs]

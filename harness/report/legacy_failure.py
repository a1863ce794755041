"""The failure record of a finding written before findings carried one: read back from its message.

A ``report.json`` finding of an older rlconform has a ``message`` and no ``failure`` field. To keep such
reports (of another device, or committed long ago) loading for ``report``, ``diff`` and ``ledger``, this
module parses the message's lines, in the wording :func:`rlconform.harness.core.failure.render_clause`
gives them, back into (each keeping its line as ``text``) :class:`~rlconform.harness.core.failure.Clause` records. It is the only reader of
a message's wording in the report layer, and it reads only reports without a ``failure`` field
(:func:`rlconform.harness.report.failure_fields.clauses`).
"""

from __future__ import annotations

import re

from rlconform.harness.core.failure import Clause

_NUM = r"[-+]?(?:nan|inf|[0-9.]+(?:e[-+]?[0-9]+)?)"
VALUE_CLAUSE = re.compile(rf"engine (?P<e>{_NUM}) vs reference (?P<r>{_NUM}) at flat index (?P<i>\d+):[^\n]*?"
                          rf"tolerance (?P<t>{_NUM})")
DIFFERENCE_CLAUSE = re.compile(rf"(?P<x>{_NUM}) vs (?:(?P<ol>[^\n]*?) = )?(?P<y>{_NUM})(?: at flat index (?P<i>\d+))? "
                               rf"\(reference (?P<r>{_NUM}), allowed difference (?P<d>{_NUM})(?:, [^)\n]*)?\)")
NONFINITE_CLAUSE = re.compile(rf"engine (?P<e>nan|-?inf) where the reference[a-z ]* is finite(?: \((?P<r>{_NUM})\))?")
RANK_CONTRACT = re.compile(r"contract: a rank-(?P<rank>\d+) input [^\n]*?\(its docstring allows ranks [^)]*\) raised "
                           r"(?P<t>[A-Za-z0-9_.]+)")
CRASH_TYPE = re.compile(r"(?:engine raised in [^:]*: )?(?P<t>[A-Z][A-Za-z0-9_.]*(?:Error|Exception|Warning))\b")
_METRIC_LABEL = re.compile(r"\bmetric [A-Za-z0-9_/]+(?: =|: engine)")
_MICRO = re.compile(r"micro-batches \(nnz\) \[(?P<n>[^\]]*)\]")
#: a lost metric's sentences (:func:`rlconform.properties.generic.metric_integrity`; the metric families)
_LOST_KEY = re.compile(r"""^emitted key '(?P<key>[^']+)' (?:was printed instead of logged \((?P<q>['"])(?P<printed>.*?)(?P=q)\)|"""
                       r"never reached the final dict)")
_LOST_OUTPUT = re.compile(r"^(?P<label>[^\n]*?) missing from the final dict")
_MUTATION = re.compile(r"\bmutated\b|modified by an inplace operation|saved for backward", re.I)


def _quantity(line: str, label: str) -> str:
    if _METRIC_LABEL.search(line):
        return "metric"
    return "gradient" if "gradient" in label else "value"


def clauses_from_message(message: str, prop: str | None = None) -> list[Clause]:
    """The clauses of an older finding's ``message``, one per line; a line in none of the judged wordings is a
    ``problem`` (a ``mutation`` under ``non_destructive``) holding the line."""
    out = []
    for line in (message or "").splitlines():
        if not line.strip():
            continue
        m = VALUE_CLAUSE.search(line)
        if m:
            head = line[:m.start()].rstrip(": ")
            out.append(Clause("value", head, _quantity(line, head), engine=float(m["e"]),
                              exact=float(m["r"]), index=int(m["i"]), tolerance=float(m["t"]), text=line))
            continue
        m = DIFFERENCE_CLAUSE.search(line)
        if m:
            micro = _MICRO.search(line)
            layout = ({"parts": "micro-batches", "nnz": [int(x) for x in re.findall(r"\d+", micro["n"])]}
                      if micro else None)
            head = line[:m.start()].rstrip(" =")
            out.append(Clause("difference", head, _quantity(line, head), engine=float(m["x"]),
                              other=float(m["y"]), other_label=m["ol"], exact=float(m["r"]), tolerance=float(m["d"]),
                              index=int(m["i"]) if m["i"] else None, layout=layout, text=line))
            continue
        m = NONFINITE_CLAUSE.search(line)
        if m:
            head = line[:m.start()].rstrip(": ")
            out.append(Clause("nonfinite", head, _quantity(line, head), engine=float(m["e"]),
                              exact=float(m["r"]) if m["r"] else None, text=line))
            continue
        m = RANK_CONTRACT.search(line)
        if m:
            out.append(Clause("contract", rank=int(m["rank"]), error_type=m["t"].rstrip(":").rsplit(".", 1)[-1],
                              text=line))
            continue
        lost = lost_metric_of(line)
        if lost is not None:
            out.append(lost)
            continue
        kind = "mutation" if prop == "non_destructive" or _MUTATION.search(line) and prop is None else "problem"
        if kind == "mutation":
            out.append(mutation_of(line))
            continue
        out.append(Clause(kind, text=line, what=what_of(line)))
    return out


def lost_metric_of(line: str) -> Clause | None:
    """The clause of an older report's lost-metric sentence, its ``key`` (and the engine's ``printed`` line)
    read from the wording, or None for another sentence."""
    m = _LOST_KEY.search(line or "")
    if m:
        return Clause("metric", text=line, what="lost metric", key=m["key"], printed=m["printed"] or "")
    m = _LOST_OUTPUT.search(line or "")
    if m:
        return Clause("problem", text=line, what="lost metric", key=m["label"].strip())
    return None


#: an older report's sentences of a changed tensor (what :class:`~rlconform.harness.core.guards.Mutation` and the
#: families wrote before the mutation clause carried its fields): ``input 'logits' mutated during forward`` (or
#: ``during <op> backward``); ``[after <op> backward, ]a producer that saved the logits for backward could not
#: backprop``; ``Σπ² read after <op> forward+backward on the same logits differs``
_MUTATED = re.compile(r"input '(?P<name>[A-Za-z_0-9]+)' mutated during (?:(?P<op>[A-Za-z_0-9]+) )?"
                      r"(?P<phase>forward|backward)")
_SAVED = re.compile(r"(?:after (?:the|(?P<op>[A-Za-z_0-9]+)) backward, )?a producer that saved the "
                    r"(?P<name>[A-Za-z_0-9]+) for backward could not backprop")
_READ_AFTER = re.compile(r"read after (?P<op>[A-Za-z_0-9]+) forward\+backward on the same (?P<name>[A-Za-z_0-9]+) "
                         r"differs")


_VERSION = re.compile(r"_version (?P<a>\d+) -> (?P<b>\d+)|is at version (?P<b2>\d+); expected version (?P<a2>\d+)")
_CHANGED = re.compile(r"(?P<n>\d+) element\(s\) changed, e\.g\. \[(?P<i>\d+)\] (?P<x>[-+0-9.e]+|nan|-?inf) -> "
                      r"(?P<y>[-+0-9.e]+|nan|-?inf)")


def _change(line: str) -> dict:
    out = {}
    v = _VERSION.search(line)
    if v:
        out["versions"] = [int(v["a"] or v["a2"]), int(v["b"] or v["b2"])]
    c = _CHANGED.search(line)
    if c:
        try:
            out.update(changed=int(c["n"]), index=int(c["i"]), other=float(c["x"]), engine=float(c["y"]))
        except ValueError:  # a value the sentence does not print as a number: the count alone
            out["changed"] = int(c["n"])
    return out


def mutation_of(line: str) -> Clause:
    """A ``mutation`` clause of an older report's sentence, its fields read from the wording (``label`` the
    tensor, ``phase``, ``by_op``, ``evidence``, the version change and a changed element); a sentence in none of
    the wordings keeps its text alone."""
    m = _MUTATED.search(line)
    if m:
        return Clause("mutation", m["name"], text=line, phase=m["phase"], by_op=m["op"] or "", evidence="changed",
                      **_change(line))
    m = _SAVED.search(line)
    if m:
        return Clause("mutation", m["name"], text=line, phase="backward", by_op=m["op"] or "", evidence="saved",
                      **_change(line))
    m = _READ_AFTER.search(line)
    if m:
        return Clause("mutation", m["name"], text=line, phase="backward", by_op=m["op"], evidence="read after")
    return Clause("mutation", text=line, evidence="changed" if "mutated" in line.lower() else "")


#: how an older clause's sentence says what is absent (:data:`rlconform.harness.core.failure.PROBLEMS`)
_PROBLEM_WORDS = (("missing gradient", ("no autograd graph", "no gradient")),
                  ("missing output", ("the engine returned shape", "nothing to compare")),
                  ("lost metric", ("missing from the final dict",)))


def what_of(text: str) -> str:
    """What an older problem sentence says is absent, or ``""``."""
    low = (text or "").lower()
    return next((what for what, words in _PROBLEM_WORDS if any(w in low for w in words)), "")


def crash_text_of(message: str) -> str:
    """The engine's exception text of a crash finding written before crash records kept it: its message, which
    quoted it."""
    return (message or "").strip()


def crash_from_message(message: str) -> dict | None:
    """``{"type": …}`` of an older crash finding: the first exception type its message names, or None."""
    m = CRASH_TYPE.search(message or "")
    return {"type": m["t"].rsplit(".", 1)[-1], "where": ""} if m else None

"""A finding's failure record, read as fields: what severity, triage and diffs ask of a failing finding.

A finding of ``report.json`` carries ``failure``: ``{"clauses": [...], "crash": {"type", "where", "text"},
"version"}`` (:mod:`rlconform.harness.core.failure`). A finding of an older report has none; its clauses are read
back from its message (:mod:`rlconform.harness.report.legacy_failure`), marked ``"from_message": true``. A record
of an earlier ``version`` than :data:`~rlconform.harness.core.failure.RECORD_VERSION` gets the fields added since
(a mutation's phase, a lost metric's key, a problem's ``what``) from its clauses' sentences; a current record is
read as it is.
"""

from __future__ import annotations

import math
import re

from rlconform.harness.core.failure import RECORD_VERSION, Clause, clauses_from_json


def record(finding: dict) -> dict:
    """The finding's ``failure`` record (built from an older finding's message when absent or malformed)."""
    rec = finding.get("failure")
    if isinstance(rec, dict) and isinstance(rec.get("clauses"), list):
        return rec
    from rlconform.harness.report import legacy_failure

    rec = {"clauses": [c.to_json() for c in legacy_failure.clauses_from_message(
        finding.get("message") or "", finding.get("property"))], "from_message": True}
    if (finding.get("xfail_of") or finding.get("status")) == "crash":
        crash = legacy_failure.crash_from_message(finding.get("message") or "")
        if crash:
            rec["crash"] = crash
    return rec


def clauses(finding: dict) -> list[Clause]:
    """The finding's failure clauses (empty for a finding that did not fail on a judged example). A ``mutation``
    clause written before mutations carried their fields (tensor, phase), or a lost metric's before it carried
    its ``key``, gets them from its sentence."""
    rec = record(finding)
    try:
        out = clauses_from_json(rec["clauses"])
    except ValueError:
        return []
    if rec.get("from_message") or _version(rec) >= RECORD_VERSION:  # read from its message, or written with them
        return out
    if any(c.kind == "mutation" and not c.phase or c.kind in ("metric", "problem") and not c.key for c in out):
        from rlconform.harness.report import legacy_failure

        out = [legacy_failure.mutation_of(c.text) if c.kind == "mutation" and not c.phase and c.text else
               (legacy_failure.lost_metric_of(c.text) or c) if c.kind in ("metric", "problem") and not c.key else c
               for c in out]
    return out


def _version(rec: dict) -> int:
    v = rec.get("version")
    return v if isinstance(v, int) and not isinstance(v, bool) else 1


def of_kind(finding: dict, *kinds: str) -> list[Clause]:
    return [c for c in clauses(finding) if c.kind in kinds]


def value_clauses(finding: dict) -> list[tuple[float, float, float]]:
    """(engine, exact, tolerance) of every ``value`` clause."""
    return [(c.engine, c.exact, c.tolerance) for c in of_kind(finding, "value")
            if None not in (c.engine, c.exact, c.tolerance)]


def difference_clauses(finding: dict) -> list[tuple[float, float, float, float]]:
    """(this run's value, the base run's value, exact, allowed difference) of every ``difference`` clause."""
    return [(c.engine, c.other, c.exact, c.tolerance) for c in of_kind(finding, "difference")
            if None not in (c.engine, c.other, c.exact, c.tolerance)]


def quote(finding: dict) -> str:
    """The first line of the finding's message, for display only (a defect row's quoted message): nothing is
    decided from it."""
    return ((finding.get("message") or "").strip().splitlines() or [""])[0]


def crash_text(finding: dict) -> str:
    """The first line of the engine's own exception text of a crash (``""``: none recorded; an older report's
    crash: its message, which quoted it)."""
    crash = record(finding).get("crash")
    text = crash.get("text") if isinstance(crash, dict) else None
    if isinstance(text, str):
        return text
    from rlconform.harness.report import legacy_failure

    return legacy_failure.crash_text_of(finding.get("message") or "") if isinstance(crash, dict) else ""


def version_check_crash(finding: dict) -> bool:
    """Whether a crash is autograd's saved-tensor version check ("one of the variables needed for gradient
    computation has been modified by an inplace operation"), as the engine's exception text says."""
    return "modified by an inplace operation" in crash_text(finding)


#: ``SomeError: its text`` as an exception's text quotes it (the engine's own, or each input rank's)
_RAISED = re.compile(r"\b(?P<exc>[A-Z]\w*(?:Error|Exception|Interrupt))(?:: (?P<text>[^\n(]*[^\n( ]))?")


def raised(finding: dict, exc_type: str) -> str:
    """The engine's text for an exception of ``exc_type`` (``too many indices for tensor of dimension 2``) in
    the finding's crash record or ``contract`` clauses, the longest where it is quoted more than once (a crash
    of every input rank quotes each rank's: "RuntimeError: rank-3 input (…): RuntimeError: one of the variables
    needed for gradient …"); ``""`` when none is recorded."""
    crash = record(finding).get("crash")
    # the record's text as the exception prints (an older report's message already quotes it so)
    own = (f"{crash_type(finding)}: {crash['text']}" if isinstance(crash.get("text"), str) else crash_text(finding)) \
        if isinstance(crash, dict) else ""
    sources = [own] + [c.text for c in of_kind(finding, "contract")]
    texts = [m["text"] or "" for t in sources for m in _RAISED.finditer(t or "") if m["exc"] == exc_type]
    return max(texts, key=len, default="")


def crash_type(finding: dict) -> str:
    """The engine's exception type of a crash (``exception`` when unknown)."""
    crash = record(finding).get("crash")
    t = crash.get("type") if isinstance(crash, dict) else None
    return t.rsplit(".", 1)[-1] if isinstance(t, str) and t else "exception"


def contract(finding: dict) -> Clause | None:
    """The first ``contract`` clause (an input rank the implementation's docstring allows raised), or None."""
    found = of_kind(finding, "contract")
    return found[0] if found else None


def nonfinite(finding: dict) -> str | None:
    """``"nan"`` / ``"inf"`` when an engine value is NaN / ±inf where the exact one is finite, else None."""
    for c in of_kind(finding, "nonfinite"):
        return "nan" if c.engine is not None and math.isnan(c.engine) else "inf"
    for e, r, _ in value_clauses(finding):
        if not math.isfinite(e) and math.isfinite(r):
            return "nan" if math.isnan(e) else "inf"
    for x, y, r, _ in difference_clauses(finding):
        if math.isfinite(r) and not (math.isfinite(x) and math.isfinite(y)):
            return "nan" if (math.isnan(x) or math.isnan(y)) else "inf"
    return None


def numeric(finding: dict) -> list[Clause]:
    """The clauses that compare numbers (``value``, ``difference``, ``nonfinite``)."""
    return of_kind(finding, "value", "difference", "nonfinite")


def texts(finding: dict, *kinds: str) -> list[str]:
    """The sentences of the finding's ``problem`` / ``mutation`` / ``metric`` / ``contract`` clauses (all of
    them, or those of ``kinds``)."""
    kinds = kinds or ("problem", "mutation", "metric", "contract")
    return [c.text for c in of_kind(finding, *kinds)]


def problems(finding: dict) -> set[str]:
    """What the finding's clauses say is absent (:data:`rlconform.harness.core.failure.PROBLEMS`): their
    ``what``; for a clause written before it carried one, read from its sentence
    (:func:`rlconform.harness.report.legacy_failure.what_of`)."""
    from rlconform.harness.report.legacy_failure import what_of

    out = set()
    older = _version(record(finding)) < RECORD_VERSION and not record(finding).get("from_message")
    for c in clauses(finding):
        if c.what:
            out.add(c.what)
        elif older and c.kind in ("problem", "metric"):
            found = what_of(c.text)
            if found:
                out.add(found)
    return out


def changed_input(finding: dict) -> bool:
    """Whether a ``mutation`` clause saw an input's bits or version change (``evidence`` ``changed``), rather than
    only a producer's backward or a later read failing on a tensor written in place."""
    return any(c.evidence == "changed" for c in of_kind(finding, "mutation"))


def parts_of(c: Clause) -> int:
    """How many parts (micro-batches, shards, DP ranks) the run of ``c`` was split into (0: unknown)."""
    nnz = (c.layout or {}).get("nnz")
    return len(nnz) if isinstance(nnz, list) else 0

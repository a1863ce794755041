"""The root-cause fields of a failing finding (issue 20 §1), recorded in the process that ran the engine:

* ``engine_function``: the site (``{"function", "module", "file", "line"}``) of the engine callable behind
  the finding's op / variant / implementation (:func:`rlconform.harness.catalog.engine_site.finding_site`);
  None for the reference engine, a mutant, or a binding whose adapter names none;
* ``crash_frame``: for a crash (or a documented input rank that raised), the deepest traceback frame inside
  the engine's package (:func:`rlconform.harness.catalog.engine_site.crash_frame`), else None;
* ``trigger``: the feature of the shrunk input that brings the failure out, in a maintainer's words (the
  op family's ``trigger`` hook, else :func:`rlconform.harness.core.triggers.trigger`).

The report's triage groups defects by them (:mod:`rlconform.harness.report.triage`). A defect's *root key*
is ``(where, class)``:

* ``where`` — ``module.qualname`` of the ``crash_frame`` for a crash, else of the ``engine_function``; the
  engine module for the class ``rounding``; ``op <op>`` when neither was recorded;
* ``class`` — the kind of failure folded into ``crash:<Type>``, ``changes a tensor``, ``NaN / inf``,
  ``partition dependence``, ``wrong value``, ``rounding``, ``missing output``, ``missing gradient``,
  ``unavailable``;

then two moves over the whole report: a finding whose ``engine_function["calls"]`` names a function that
fails in the same class under the same trigger takes that function's key, and a ``wrong value`` under the
trigger of a ``partition dependence`` of the same place takes the partition's key. The trigger is never
part of the key. The defect id is ``triage.defect_id(where, class)``, a function of the key only.
"""

from __future__ import annotations

from rlconform.harness.catalog.engine_site import crash_frame, finding_site
from rlconform.harness.core import triggers

FAILING = ("discrepancy", "crash", "xfail")


def family_of(op: str):
    """The :class:`~rlconform.harness.families.OpFamily` holding ``op``, or None."""
    from rlconform.harness.families import all_families

    for fam in all_families():
        if any(info.name == op for info in fam.ops):
            return fam
    return None


def trigger_of(case, message: str, kind: str) -> str:
    """The family's trigger of ``case``: what the message alone shows first (``a masked position holding
    NaN`` for a ``masked = nan:`` clause, as the report's triage reads it), then its hook, then the generic
    reading."""
    said = triggers.message_trigger(message)
    if said:
        return said
    fam = family_of(case.op)
    hook = getattr(fam, "trigger", None)
    if hook is not None:
        try:
            found = hook(case, message, kind)
        except Exception:  # noqa: BLE001 - a hook that cannot read the input leaves the generic reading
            found = None
        if found:
            return found
    return triggers.trigger(case.op, case.property, case.dtype, case.regime, case.inputs, message, kind)


def declared_trigger(binding, op: str, regime: str, trig: str) -> str:
    """``trig``, or — when it reads ``any input`` — the binding's words for the finding's variant
    (``Binding.variant_triggers``: op -> variant -> trigger), when it declares them."""
    if trig != "any input":
        return trig
    from rlconform.harness.core.opinfo import split_regime

    words = ((getattr(binding, "variant_triggers", None) or {}).get(op) or {}).get(split_regime(regime or "")[0])
    return words or trig


def engine_tracebacks(exc: BaseException | None) -> list[str]:
    """The engine tracebacks carried by ``exc`` and everything it groups or chains (``engine_traceback``
    of an EngineCrash, a rank's text), deepest last."""
    out, pending, seen = [], [exc], set()
    while pending:
        e = pending.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = getattr(e, "engine_traceback", None)
        if tb:
            out.append(tb)
        pending += list(getattr(e, "exceptions", ()) or ()) + [e.__cause__, e.__context__]
    return out


def fields(binding, finding: dict, exc: BaseException | None, case) -> dict:
    """``{"engine_function", "crash_frame", "trigger"}`` of a failing finding; ``{}`` for any other."""
    if finding.get("status") not in FAILING:
        return {}
    from rlconform.harness.report.severity import contract_crash_type, is_metric
    from rlconform.harness.report.triage import kind

    msg = finding.get("message") or ""
    k = kind(finding)
    trig = trigger_of(case, msg, k) if case is not None else "any input"
    trig = declared_trigger(binding, finding["op"], finding.get("regime") or "", trig)
    site, packages = finding_site(binding, finding["op"], finding["property"], finding["regime"], msg,
                                  metric=is_metric(finding), trigger=trig)
    frame = None
    if k.startswith("crash:") or contract_crash_type(msg):
        frame = crash_frame(engine_tracebacks(exc) + [finding.get("traceback") or "", msg], packages)
    return {"engine_function": site, "crash_frame": frame, "trigger": trig}

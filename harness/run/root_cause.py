"""The root-cause fields of a failing finding, recorded in the process that ran the engine:

* ``engine_function``: the site (``{"function", "module", "file", "line"}``) of the engine callable behind
  the finding's op / variant / implementation (:func:`rlconform.harness.catalog.engine_site.finding_site`);
  None for the reference engine, a mutant, or a binding whose adapter names none;
* ``crash_frame``: for a crash (or a documented input rank that raised), the deepest traceback frame inside
  the engine's package (:func:`rlconform.harness.catalog.engine_site.crash_frame`), else None;
* ``trigger``: the feature of the shrunk input that brings the failure out, in a maintainer's words (the
  op family's ``trigger`` hook, else :func:`rlconform.harness.core.triggers.trigger`);
* ``engine_function["fault"]``: the line of the engine function a report cites (:func:`locate`): its
  shrunk input and a few passing examples of the same finding (:data:`PASSING_EXAMPLES`, drawn afresh
  from its strategy) are re-run with the function's lines traced, and the most suspicious line that
  discriminates (Ochiai) is cited; else the binding's declared anchor; else the function
  (:mod:`rlconform.harness.core.fault_lines`). Only failing findings pay for it.

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


def trigger_of(case, clauses, kind: str, crash_text: str = "") -> str:
    """The family's trigger of ``case`` whose failure record is ``clauses``
    (:class:`rlconform.harness.core.failure.Clause`; ``crash_text`` the engine's exception text): what the
    record alone shows first (``a masked position holding NaN`` for a clause of a run with NaN at the masked
    positions, as the report's triage reads it), then its family's hook, then the generic reading."""
    said = triggers.said_trigger(clauses, crash_text)
    if said:
        return said
    fam = family_of(case.op)
    hook = getattr(fam, "trigger", None)
    if hook is not None:
        try:
            found = hook(case, list(clauses or ()), kind)
        except Exception:  # noqa: BLE001 - a hook that cannot read the input leaves the generic reading
            found = None
        if found:
            return found
    return triggers.trigger(case.op, case.property, case.dtype, case.regime, case.inputs, clauses, kind, crash_text)


def declared_trigger(binding, op: str, regime: str, trig: str) -> str:
    """``trig``, or the binding's words for it (``Binding.variant_triggers``: op -> variant or trigger ->
    words): when it reads ``any input``, those of the finding's variant; else those of the trigger itself (an
    edge input one of the engine's configurations produces: verl's sequence-level rejection leaves rows with no
    valid token), when the binding declares them."""
    from rlconform.harness.core.opinfo import split_regime

    declared = (getattr(binding, "variant_triggers", None) or {}).get(op) or {}
    words = declared.get(split_regime(regime or "")[0]) if trig == "any input" else declared.get(trig)
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
    from rlconform.harness.report import failure_fields as F
    from rlconform.harness.report.severity import contract_crash_type, is_metric
    from rlconform.harness.report.triage import kind

    clauses, crash_text = F.clauses(finding), F.crash_text(finding)
    k = kind(finding)
    trig = trigger_of(case, clauses, k, crash_text) if case is not None else "any input"
    trig = declared_trigger(binding, finding["op"], finding.get("regime") or "", trig)
    # a wrong logged metric is its fold's (a mean of micro-batch means); a NaN one is its emitter's (a fold of
    # finite values is finite: SkyRL's importance_sampling_loss logs the mean of an empty selection), and so is
    # one off by rounding on an unpartitioned input (the dtype its emitter computes in: a bf16 ratio_mean)
    folded = k not in ("NaN", "inf") and not (k == "inexact value" and finding["property"] != "partition_invariant")
    site, packages = finding_site(binding, finding["op"], finding["property"], finding["regime"], clauses,
                                  metric=is_metric(finding) and folded, trigger=trig)
    frame = None
    if k.startswith("crash:") or contract_crash_type(finding):
        frame = _contract_frame(clauses, packages) or \
            crash_frame(engine_tracebacks(exc) + [finding.get("traceback") or "", crash_text], packages)
    elif site is not None and case is not None and finding["property"] != "non_destructive":
        # a crash cites its frame's line, a changed tensor its writer (a backward, a ``via`` statement);
        # anything else its faulty line
        found = locate(binding, case, site, k, trig)
        if found is not None:
            site = dict(site, fault=found)
    return {"engine_function": site, "crash_frame": frame, "trigger": trig}


def _contract_frame(clauses, packages) -> dict | None:
    """The engine frame a ``contract`` clause recorded for the input rank that raised (the first inside the
    engine's ``packages``), or None."""
    from rlconform.harness.core.engine_frames import is_engine_file, qualname

    for c in clauses:
        f = c.frame if c.kind == "contract" else None
        if isinstance(f, dict) and isinstance(f.get("file"), str) and is_engine_file(f["file"], packages):
            out = dict(f)  # a name the process that made the clause could not qualify is qualified here
            out["function"] = qualname(str(f.get("module") or ""), str(f.get("function") or ""), int(f.get("line") or 0))
            return out
    return None


#: passing examples of a failing finding drawn to contrast its shrunk input with (:func:`locate`)
PASSING_EXAMPLES = 3
#: (engine function, kind of failure) -> its fault, once per worker process: the findings of one defect
#: (its key is that pair) are located once, by the first of them to fail
_LOCATED: dict = {}


def trace_case(binding, case, fn) -> tuple[set, str | None]:
    """``(lines of fn executed, verdict)`` of one check of ``case`` with ``fn``'s lines traced
    (:func:`rlconform.harness.core.fault_lines.trace_lines`); the verdict is None when the check raised."""
    from rlconform.harness.core.fault_lines import trace_lines
    from rlconform.harness.run.dispatch import run_check
    from rlconform.properties.referee import probing

    with probing():  # not an example of the finding: its verdict does not count as one
        lines, outcome, error = trace_lines([fn], lambda: run_check(binding, case))
    return lines, (None if error is not None else getattr(outcome, "verdict", None))


def passing_cases(case, n: int = PASSING_EXAMPLES, seed: int = 0) -> list:
    """Up to ``n`` fresh examples of ``case``'s finding (same op, property, dtype, regime) drawn from its
    strategy; whether they pass is :func:`locate`'s to find."""
    import dataclasses
    import random
    import warnings

    from hypothesis import HealthCheck, given, settings

    from rlconform.harness.catalog.ops import strategy_for

    out: list = []
    strat = strategy_for(case.op, case.dtype, case.regime)

    @settings(max_examples=n, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck), phases=("generate",))
    @given(strat)
    def draw(inputs):
        out.append(dataclasses.replace(case, inputs=inputs))

    state = random.getstate()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            draw()
        except Exception:  # noqa: BLE001 - a strategy that cannot draw here leaves what it drew
            pass
    random.setstate(state)
    return out[:n]


def locate(binding, case, site: dict, kind: str = "", trigger: str = "") -> dict | None:
    """The faulty line of the engine function at ``site`` for the failing ``case`` (its shrunk input) whose failure
    is of ``kind`` under ``trigger`` (a declared anchor may name either):
    traced on ``case`` and, when ``fn`` has a branch (:func:`~rlconform.harness.core.fault_lines.has_branches`),
    on the passing ones of :func:`passing_cases` (a count, never a time budget: the cited line must not
    depend on the machine's speed); once per engine
    function × kind of failure × trigger in a process (:data:`_LOCATED`),
    localized by :func:`rlconform.harness.catalog.engine_site.fault`. Distributed ops (their engine runs on
    gloo ranks, out of this process's trace) get the declared anchor only. None: the site names no
    function of this process."""
    from rlconform.harness.catalog.engine_site import engine_importer, fault, site_callable
    from rlconform.harness.catalog.ops import get_op
    from rlconform.harness.core.fault_lines import has_branches

    fn = site_callable(site, engine_importer(binding))
    if fn is None:
        return None
    key = (site.get("module"), site.get("function"), kind, trigger, site.get("output_anchor"))
    if key in _LOCATED:
        return dict(_LOCATED[key])
    failing, passing = [], []
    try:
        distributed = get_op(case.op).distributed
    except Exception:  # noqa: BLE001 - an op outside the catalog is not traced
        distributed = True
    if not distributed and has_branches(fn):  # straight-line code: every example runs the same lines
        try:
            lines, _ = trace_case(binding, case, fn)
            if lines:
                failing.append(lines)
                for other in passing_cases(case):
                    lines, verdict = trace_case(binding, other, fn)
                    if verdict == "pass" and lines:
                        passing.append(lines)
        except Exception:  # noqa: BLE001 - what could not be traced is not evidence
            failing, passing = [], []
    found = fault(binding, site, failing, passing, kind, trigger)
    if found is not None:
        _LOCATED[key] = dict(found)
    return found

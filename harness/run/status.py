"""The one place that decides a finding's status.

The engine's worker reports what it *observed* (:func:`observe`: the test passed, failed on a property,
the engine raised, the op could not be loaded, the binding is broken, rlconform's own code raised) and the
worst error over tolerance of its examples. The process that writes the report decides the status from
that, the referee's verdicts, the margin band and the ledger (:func:`decide`), and nothing else writes a
finding's ``status``:

1. **the observation**: one of :data:`OBSERVED`; anything else a worker sends is a ``crash`` (a worker
   that claims a ledger status, ``xfail`` / ``xpass``, is read as the failure it names under it);
2. **the referee** (:class:`~rlconform.harness.run.referee_verdicts.VerdictBook`), for an op it judges: a
   green observation that the referee judged failing takes the referee's status, numbers and failure
   record; a green one with examples the referee never saw is a ``crash``; the error over tolerance is
   never below the referee's;
3. **the margin band** (:func:`rlconform.harness.core.tolerance.verdict`): a green finding whose worst
   example lies in the band is ``marginal``;
4. **the ledger**: a finding id the ledger lists is ``xfail`` when it fails (``xfail_of`` says what it
   is: ``discrepancy``, ``crash``, ``marginal``, ``unavailable``) and ``xpass`` when it passes; a failing
   finding under a defect line is ``xfail`` with ``ledger_defect``, unless its error grew past the
   magnitude its member line records (``ledger_grown``: it stays red). A ``binding_error`` and an ``error``
   (rlconform's or its binding's fault, never the engine's) are never matched.
"""

from __future__ import annotations

import math

#: what an engine's worker may report it observed
OBSERVED = ("pass", "marginal", "discrepancy", "crash", "error", "unavailable", "binding_error")
#: statuses a finding of report.json may have
STATUSES = OBSERVED + ("xfail", "xpass")
#: observations that a referee's failing verdict contradicts
GREEN = ("pass", "marginal")
#: observations that the ledger turns into ``xfail``
LISTABLE = ("discrepancy", "crash", "marginal", "unavailable")
#: the message of an ``xpass``
XPASS_MESSAGE = "listed in the xfails ledger but now passes: remove it from the ledger"
#: what a worker may report as the failure under an xfail it claims (``xfail_of``)
_UNDERLYING = ("discrepancy", "crash", "marginal", "unavailable", "error", "binding_error")


def observe(*, passed: bool, unavailable: bool, binding_error: bool, failure: str | None,
            max_ratio: float) -> str:
    """What the engine's worker saw of one finding (one of :data:`OBSERVED`), whatever the ledger says.

    ``passed``: every example held (pytest's own outcome with the ledger's xfail mark undone);
    ``unavailable``: the op or variant could not be loaded; ``binding_error``: the binding itself failed;
    ``failure``: :func:`rlconform.harness.run.recorder.classify` of the exception of a failed test
    (``discrepancy``, ``crash`` or ``error``), None when it passed; ``max_ratio``: the worst error over
    tolerance of its examples."""
    from rlconform.harness.core.tolerance import verdict

    if unavailable:
        return "unavailable"
    if binding_error:
        return "binding_error"
    if passed or failure is None:
        return "marginal" if verdict(max_ratio) == "marginal" else "pass"
    return failure


def _number(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def _observation(finding: dict) -> str:
    """The worker's observation in ``finding`` (``observed``, or an older worker's ``status``), as one of
    :data:`OBSERVED`."""
    seen = finding.pop("observed", None) or finding.get("status")
    if seen in ("xfail", "xpass"):  # only the controller's ledger gives these
        under = finding.get("xfail_of")
        return under if under in _UNDERLYING else ("pass" if seen == "xpass" else "discrepancy")
    if seen not in OBSERVED:
        finding["message"] = f"the engine's worker reported an unknown outcome {str(seen)[:80]!r}"
        from rlconform.harness.core.failure import crash_record

        finding["failure"] = crash_record("exception", "the engine's worker", finding["message"])
        return "crash"
    return seen


def decide(finding: dict, *, listed=frozenset(), verdicts=None, ledger=None):
    """Set ``finding``'s ``status`` (and ``xfail_of``, ``xfail_listed``, ``ledger_defect``) from the
    worker's observation, the referee's verdicts (``verdicts``: a
    :class:`~rlconform.harness.run.referee_verdicts.VerdictBook`, None without a referee), the margin band,
    the ledger's finding ids (``listed``) and its defect lines (``ledger``: a
    :class:`~rlconform.harness.report.xfails.Ledger`, or None). Returns the defect line that matched (also
    for a member that grew past it and stays red), or None. ``finding`` is changed in place."""
    from rlconform.harness.core.tolerance import verdict

    if not isinstance(finding.get("id"), str):
        finding.pop("observed", None)
        finding.update(status="crash", message="the engine's worker reported a finding without an id",
                       xfail_listed=False)
        return None
    status = _observation(finding)
    for stale in ("xfail_of", "ledger_defect", "ledger_grown"):
        finding.pop(stale, None)
    if verdicts is not None:
        status = verdicts.apply(finding, status)
    ratio = _number(finding.get("max_ratio"))
    if status == "pass" and ratio is not None and verdict(ratio) == "marginal":
        status = "marginal"
        if not finding.get("message"):
            finding["message"] = f"worst example at {ratio:.3g}× its tolerance"
    if ratio is None or not math.isfinite(ratio):
        finding["max_ratio"] = None
    listed_here = finding["id"] in listed
    finding["xfail_listed"] = listed_here
    finding["status"] = status
    if listed_here:
        if status in LISTABLE:
            finding["xfail_of"], finding["status"] = status, "xfail"
            if status == "marginal":
                finding["message"] = ((finding.get("message") or "")
                                      + " (marginal: inside the margin band; listed in the ledger)")
        elif status == "pass":
            finding["status"] = "xpass"
            finding["message"] = XPASS_MESSAGE
        return None
    if ledger is None or not ledger.defects or status not in LISTABLE:
        return None
    line = ledger.match(finding)
    if line is None:
        return None
    grown = line.grown(finding) if status != "marginal" else None
    if grown is not None:  # the accepted defect grew: red, as a new failure under the line would be
        finding["ledger_grown"] = grown
        finding["message"] = ((finding.get("message") or "") + f" (grown: {grown['max_ratio']:.3g}× its tolerance, "
                              f"its ledger line {grown['line']} recorded {grown['recorded']:.3g}×)")
        return line  # the line's defect still fails (the line is not fixed); this finding is red under it
    if status == "marginal":
        finding["message"] = (finding.get("message") or "") + " (marginal: inside the margin band; listed in the ledger)"
    finding["xfail_of"], finding["status"] = status, "xfail"
    finding["xfail_listed"] = True
    finding["ledger_defect"] = line.key
    return line

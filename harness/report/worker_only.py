"""What only the engine's process could report: a finding that is ``unavailable`` (the op or variant did not
load) or a ``binding_error`` (the binding does not fit this engine version). The referee cannot check these;
they can only make a finding red, never green (:mod:`rlconform.harness.run.status`), and the first screen
(report.md, the terminal summary) and the pull-request comment count them, listed in a ledger or not.
"""

from __future__ import annotations

#: statuses only the engine's process can report
WORKER_ONLY = ("unavailable", "binding_error")


def worker_only_counts(doc: dict) -> dict[str, int]:
    """``{status: count}`` of the findings of report ``doc`` whose status only the engine's process could
    report (:data:`WORKER_ONLY`; a ledger's ``xfail`` of one counts as what it is), without zero counts."""
    counts = {s: 0 for s in WORKER_ONLY}
    for f in doc.get("findings") or ():
        status = f.get("xfail_of") if f.get("status") == "xfail" else f.get("status")
        if status in counts:
            counts[status] += 1
    return {s: n for s, n in counts.items() if n}


def worker_only_line(doc: dict, bold: str = "**") -> str:
    """The first screen's line of :func:`worker_only_counts` (``""`` when there is none): ``reported by the
    engine's process alone (red, never green): unavailable **12** · binding error **1**``."""
    counts = worker_only_counts(doc)
    if not counts:
        return ""
    return ("reported by the engine's process alone (red, never green, listed or not): "
            + " · ".join(f"{s.replace('_', ' ')} {bold}{n}{bold}" for s, n in counts.items()))

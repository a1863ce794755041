"""The controller's record of the referees' verdicts, and the rule that a finding's status follows them
(issue 22 §1).

Each engine worker of a check has its referee (:mod:`rlconform.harness.workers.referee`, started by the
controller before the worker imports the engine). The referee sends every verdict it reaches straight to
the controller; the worker gets the same verdict and reports the finding as before. :meth:`VerdictBook.overrule`
applies the referee's record to the finding the worker reported: a finding reported ``pass``, ``xpass`` or
``marginal`` is a ``discrepancy`` when its referee judged one of its examples a discrepancy, an ``error``
(rlconform's, not the engine's) when its referee's evaluation diverged, and a ``crash`` when its referee
judged an engine crash, or when the worker reports examples the referee never saw (a worker whose checks were diverted past the referee). The worker's own report can
make a finding worse, never better.
"""

from __future__ import annotations

import collections

#: statuses a worker's report may claim that the referee's record can contradict
GREEN = ("pass", "xpass", "marginal")


def refereed(op) -> bool:
    """Whether the findings of ``op`` are judged by a referee: every op of the catalog, single-process and
    distributed families alike (a distributed family's evaluation runs in the referee; the engine's worker
    makes the round trips to its gloo ranks: :func:`rlconform.distributed_tests.checks.run_ranks`)."""
    from rlconform.harness.catalog.ops import OPS

    return isinstance(op, str) and op in OPS


class VerdictBook:
    """Per finding id: how many verdicts the referees sent, and the first failing one."""

    def __init__(self):
        self.seen: collections.Counter = collections.Counter()
        self.failing: dict[str, tuple[str, str]] = {}

    def add(self, verdicts) -> None:
        for v in verdicts:
            try:
                fid, kind, verdict, message = v
            except (TypeError, ValueError):
                continue
            fid = str(fid)
            self.seen[fid] += 1
            if fid in self.failing:
                continue
            if kind == "outcome" and verdict == "discrepancy":
                self.failing[fid] = ("discrepancy", str(message))
            elif kind == "diverged":  # rlconform's own failure to judge: a harness error, never the engine's
                from rlconform.properties.referee import REFEREE_ERROR  # lazily: it imports torch

                self.failing[fid] = ("error", f"{REFEREE_ERROR}: {message}")
            elif kind == "own_error":  # rlconform's yardstick raised on the engine's data (harness.core.blame)
                self.failing[fid] = ("error", str(message))
            elif kind != "outcome":
                self.failing[fid] = ("crash", f"the referee: {message}")

    def overrule(self, finding: dict) -> dict:
        """``finding`` (a report entry, changed in place and returned) with the referee's record applied."""
        fid, status = finding.get("id"), finding.get("status")
        if status not in GREEN or not isinstance(fid, str):
            return finding
        if fid in self.failing:
            new, message = self.failing[fid]
            finding["status"] = "xfail" if status == "xpass" and new != "error" else new
            finding["message"] = (f"{message} (the referee's verdict; the engine's worker reported {status})")[:4000]
            return finding
        examples = finding.get("examples") or 0
        if isinstance(examples, int) and examples > self.seen.get(fid, 0) and refereed(finding.get("op")):
            finding["status"] = "crash"
            finding["message"] = (f"the engine's worker reported {examples} example(s) of this finding as {status}, "
                                  f"its referee judged {self.seen.get(fid, 0)}: the checks did not all reach the referee")
        return finding

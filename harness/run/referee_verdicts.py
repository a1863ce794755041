"""The controller's record of the referees' verdicts, and the rule that a finding's status follows them.

Each engine worker of a check has its referee (:mod:`rlconform.harness.workers.referee`, started by the
controller before the worker imports the engine). The referee sends every verdict it reaches straight to
the controller; the worker gets the same verdict and reports the finding as before. :meth:`VerdictBook.apply`
applies the referee's record to the worker's observation of a finding (for
:func:`rlconform.harness.run.status.decide`, the one place that decides a status): a finding observed ``pass`` or
``marginal`` is a ``discrepancy`` when its referee judged one of its examples a discrepancy, an ``error``
(rlconform's, not the engine's) when its referee's evaluation diverged, and a ``crash`` when its referee
judged an engine crash, or when the worker reports examples the referee never saw (a worker whose checks were diverted past the referee). The worker's own report can
make a finding worse, never better.
"""

from __future__ import annotations

import collections

#: observations that the referee's record can contradict
GREEN = ("pass", "marginal")


def refereed(op) -> bool:
    """Whether the findings of ``op`` are judged by a referee: every op of the catalog, single-process and
    distributed families alike (a distributed family's evaluation runs in the referee; the engine's worker
    makes the round trips to its gloo ranks: :func:`rlconform.distributed_tests.checks.run_ranks`)."""
    from rlconform.harness.catalog.ops import OPS

    return isinstance(op, str) and op in OPS



def _number(x) -> float | None:
    """``x`` as a float when it is a real number (bool excluded), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


class VerdictBook:
    """Per finding id: how many verdicts the referees sent, the first failing one, and the worst numbers
    (error over tolerance, absolute and relative error) the referee measured."""

    def __init__(self):
        self.seen: collections.Counter = collections.Counter()
        self.failing: dict[str, tuple[str, str]] = {}
        self.worst: dict[str, dict] = {}
        self.failing_numbers: dict[str, dict] = {}

    def add(self, verdicts) -> None:
        for v in verdicts:
            try:
                fid, kind, verdict, message, *rest = v
            except (TypeError, ValueError):
                continue
            if kind == "probe":  # a re-run that locates a fault (properties.referee.probing): not an example
                continue
            fid = str(fid)
            self.seen[fid] += 1
            numbers = rest[0] if rest and isinstance(rest[0], dict) else {}
            if numbers:
                worst = self.worst.setdefault(fid, {})
                for k, x in numbers.items():
                    x = _number(x)
                    if x is not None and not (x != x) and (k not in worst or x > worst[k]):
                        worst[k] = x
            if fid in self.failing:
                continue
            if kind == "outcome" and verdict == "discrepancy":
                self.failing[fid] = ("discrepancy", str(message))
                self.failing_numbers[fid] = dict(numbers)
            elif kind == "diverged":  # rlconform's own failure to judge: a harness error, never the engine's
                from rlconform.properties.referee import REFEREE_ERROR  # lazily: it imports torch

                self.failing[fid] = ("error", f"{REFEREE_ERROR}: {message}")
            elif kind == "own_error":  # rlconform's yardstick raised on the engine's data (harness.core.blame)
                self.failing[fid] = ("error", str(message))
            elif kind != "outcome":
                self.failing[fid] = ("crash", f"the referee: {message}")
                self.failing_numbers[fid] = dict(numbers)

    def apply(self, finding: dict, status: str) -> str:
        """The status of ``finding`` (a report entry, whose numbers are changed in place) once the referee's
        record is applied to the worker's observation ``status`` (:func:`rlconform.harness.run.status.decide`
        calls it; nothing else does). For an op the referee judges: a green observation that the referee
        judged failing takes the referee's status, numbers and failure record; a green one the referee judged
        no example of, or whose example count is not a count the referee saw, is a crash; the error over
        tolerance is never below the referee's."""
        fid = finding["id"]
        if not refereed(finding.get("op")):
            return status
        seen = self.seen.get(fid, 0)
        if status in GREEN and fid in self.failing:
            new, message = self.failing[fid]
            numbers = self.failing_numbers.get(fid) or {}
            clauses = numbers.get("clauses")
            if new == "discrepancy" and isinstance(clauses, list):
                from rlconform.harness.core import failure

                try:
                    message = failure.render(failure.clauses_from_json(clauses))
                    finding["failure"] = {"clauses": clauses}
                except (TypeError, ValueError):
                    finding.pop("failure", None)
            else:  # a crash: the engine's exception as the referee saw it
                finding["failure"] = _crash_record(numbers.get("crash"), "the referee", message)
            finding["message"] = (f"{message} (the referee's verdict; the engine's worker reported {status})")[:4000]
            for field in ("max_abs_err", "max_rel_err", "tolerance"):
                if field in numbers and _number(numbers[field]) is not None:
                    finding[field] = float(numbers[field])
            status = new
        elif status in GREEN:
            examples = finding.get("examples")
            if seen == 0 or isinstance(examples, bool) or not isinstance(examples, int) or not 0 < examples <= seen:
                said = (f"the engine's worker reported {examples!r} example(s) of this finding as {status}, its "
                        f"referee judged {seen}: the checks did not all reach the referee")
                finding["message"], finding["failure"] = said, _crash_record(None, "the referee", said)
                status = "crash"
        if fid in self.worst and "ratio" in self.worst[fid]:
            ref = self.worst[fid]["ratio"]
            mine = _number(finding.get("max_ratio"))
            worst = ref if mine is None else max(mine, ref)
            finding["max_ratio"] = worst if worst != float("inf") else None
        return status


def _crash_record(crash, where: str, message: str) -> dict:
    """The failure record of a crash the controller decides: the engine's exception as the referee sent it
    (``{"type", "where", "text"}``), else an unknown exception at ``where`` with the first line of ``message``."""
    from rlconform.harness.core.failure import crash_record

    if isinstance(crash, dict) and all(isinstance(crash.get(k), str) for k in ("type", "where", "text")):
        return crash_record(crash["type"], crash["where"], crash["text"])
    return crash_record("exception", where, message)

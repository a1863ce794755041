"""A failing finding's probes are not its examples. To cite the faulty line, the worker re-runs the shrunk
input and a few fresh examples of the finding (``root_cause.locate``), through the referee when there is one.
Those re-runs are judged, but their verdicts must not count as the finding's: a fresh example can fail far
worse than the finding's own (verl's ``drgrpo+vectorized@singleton_groups``: 238× its tolerance, 3.41e8× on a
probe), and the worker locates a defect once, on whichever of its findings failed first there, so counting
probes made a finding's ``max_ratio`` — and with it a ledger member's recorded magnitude — depend on what the
worker had checked before."""

from __future__ import annotations

import pickle
import types

import numpy as np

from rlconform.harness.run import status
from rlconform.harness.run.referee_verdicts import VerdictBook
from rlconform.properties import referee
from rlconform.properties.case import Case

FID = "entropy.matches_reference.float32.moderate"


def _entry(examples=1):
    return {"id": FID, "op": "entropy", "observed": "pass", "examples": examples, "max_ratio": 0.25}


def test_the_controller_ignores_a_probes_verdict():
    book = VerdictBook()
    book.add([(FID, "outcome", "pass", "", {"ratio": 0.5}),
              (FID, "probe", "discrepancy", "a fresh example failing", {"ratio": 3.4e8})])
    entry = _entry()
    status.decide(entry, verdicts=book)
    assert entry["status"] == "pass" and entry["max_ratio"] == 0.5, entry


def test_probes_alone_are_no_examples_the_referee_saw():
    book = VerdictBook()  # a worker that sent its examples as probes: the referee judged none of them
    book.add([(FID, "probe", "pass", "", {"ratio": 0.1})])
    entry = _entry()
    status.decide(entry, verdicts=book)
    assert entry["status"] == "crash" and "did not all reach the referee" in entry["message"], entry


def _judge(probe: bool):
    case = Case("entropy", "matches_reference", "float32", "moderate", {"logits": np.ones((2, 3))})
    outcome = types.SimpleNamespace(verdict="discrepancy", ratio=7.0, max_abs_err=1.0, max_rel_err=1.0,
                                    tolerance=0.1, clauses=[], message="wrong")
    request = {"case": case, "binding": None}
    if probe:
        request["probe"] = True
    payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
    return referee.judge(payload, lambda binding, c: outcome, exchange=lambda data: b"")


def test_the_referee_labels_a_probes_verdict_and_judges_it_as_any_other():
    (reply, verdict), (probe_reply, probe_verdict) = _judge(False), _judge(True)
    assert verdict[:3] == (FID, "outcome", "discrepancy")
    assert probe_verdict[:3] == (FID, "probe", "discrepancy") and probe_verdict[3:] == verdict[3:]
    assert probe_reply[0] == reply[0] == "outcome"  # the worker gets its verdict (locate reads it)


def test_locating_a_fault_runs_its_checks_as_probes(monkeypatch):
    from rlconform.harness.run import dispatch, root_cause

    seen = []

    def run_check(binding, case):
        seen.append(bool(referee._PROBING))
        return types.SimpleNamespace(verdict="pass")

    monkeypatch.setattr(dispatch, "run_check", run_check)
    lines, verdict = root_cause.trace_case(None, None, len)
    assert seen == [True] and verdict == "pass"
    assert not referee._PROBING  # only inside the re-run

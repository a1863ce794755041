"""One place decides a finding's status (:mod:`rlconform.harness.run.status`): from the worker's observation,
the referee's verdicts, the margin band and the ledger; nothing else in the package writes a finding's
``status``."""

from __future__ import annotations

import ast
import pathlib

import pytest

from rlconform.harness.core.tolerance import FAIL_ABOVE, PASS_BELOW
from rlconform.harness.report.xfails import parse_ledger
from rlconform.harness.run import status
from rlconform.harness.run.referee_verdicts import VerdictBook

FID = "entropy.matches_reference.float32.moderate"
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _finding(observed="pass", fid=FID, **extra) -> dict:
    op, prop, dtype, regime = fid.split(".")
    return {"id": fid, "op": op, "property": prop, "dtype": dtype, "regime": regime, "observed": observed,
            "examples": 3, "max_ratio": 0.5, "message": "", **extra}


@pytest.mark.parametrize("observed", status.OBSERVED)
def test_an_observation_without_ledger_or_referee_is_the_status(observed):
    f = _finding(observed)
    assert status.decide(f) is None
    assert f["status"] == observed and "observed" not in f and f["xfail_listed"] is False


def test_the_margin_band_makes_a_pass_marginal():
    inside = (PASS_BELOW + FAIL_ABOVE) / 2
    f = _finding("pass", max_ratio=inside)
    status.decide(f)
    assert f["status"] == "marginal" and f"{inside:.3g}×" in f["message"]
    below = _finding("pass", max_ratio=PASS_BELOW / 2)
    status.decide(below)
    assert below["status"] == "pass"


def test_only_the_ledger_gives_xfail_and_xpass():
    forged = _finding("xfail", xfail_of="discrepancy", xfail_listed=True)  # a worker claiming the ledger's word
    status.decide(forged)
    assert forged["status"] == "discrepancy" and forged["xfail_listed"] is False and "xfail_of" not in forged
    xpass = _finding("xpass")
    status.decide(xpass)
    assert xpass["status"] == "pass"
    listed = _finding("crash")
    status.decide(listed, listed={FID})
    assert (listed["status"], listed["xfail_of"], listed["xfail_listed"]) == ("xfail", "crash", True)
    fixed = _finding("pass")
    status.decide(fixed, listed={FID})
    assert fixed["status"] == "xpass" and fixed["message"] == status.XPASS_MESSAGE


@pytest.mark.parametrize("observed", ["error", "binding_error"])
def test_rlconforms_and_the_bindings_faults_are_never_listed(observed, tmp_path):
    path = tmp_path / "xfails.txt"
    path.write_text("defect op entropy | wrong value | entropy.matches_reference\n")
    f = _finding(observed)
    assert status.decide(f, listed={FID}, ledger=parse_ledger(str(path))) is None
    assert f["status"] == observed


def test_an_unknown_observation_is_a_crash():
    f = _finding("looks fine to me")
    status.decide(f)
    assert f["status"] == "crash" and "unknown outcome" in f["message"]
    nameless = {"observed": "pass"}
    status.decide(nameless)
    assert nameless["status"] == "crash"


def test_the_referees_failing_verdict_overrules_a_green_observation_with_its_own_record():
    from rlconform.harness.core import failure

    clause = failure.value("entropy", "value", engine=0.5, exact=1.0, index=3, abs_err=0.5, rel_err=0.5, ulp_err=4e6,
                           tolerance=1e-6, ratio=5e5, dtype="float32")
    book = VerdictBook()
    book.add([(FID, "outcome", "discrepancy", "ignored: rendered from the clauses",
               {"ratio": 5e5, "max_abs_err": 0.5, "max_rel_err": 0.5, "tolerance": 1e-6,
                "clauses": failure.clauses_to_json([clause])})])
    f = _finding("pass", max_ratio=0.1)
    status.decide(f, verdicts=book)
    assert f["status"] == "discrepancy" and f["max_ratio"] == 5e5 and f["max_abs_err"] == 0.5
    assert f["message"].startswith(failure.render([clause])) and "ignored" not in f["message"]
    assert f["failure"]["clauses"] == failure.clauses_to_json([clause])
    # listed in the ledger, the referee's discrepancy is an xfail of a discrepancy
    g = _finding("pass", max_ratio=0.1)
    status.decide(g, listed={FID}, verdicts=book)
    assert (g["status"], g["xfail_of"]) == ("xfail", "discrepancy")


def test_a_green_observation_the_referee_never_saw_is_a_crash():
    f = _finding("pass")
    status.decide(f, verdicts=VerdictBook())
    assert f["status"] == "crash" and "did not all reach the referee" in f["message"]


def _status_writes(path: pathlib.Path):
    """(function, line) of every write of a ``status`` field in ``path``: ``x["status"] = …``,
    ``x.update(status=…)``, ``dict(…, status=…)``."""
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AugAssign) else []
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            if any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == "status"
                   for t in flat):
                yield fn.name, node.lineno
            if isinstance(node, ast.Call) and any(k.arg == "status" for k in node.keywords) and \
                    getattr(node.func, "attr", getattr(node.func, "id", "")) in ("update", "dict"):
                yield fn.name, node.lineno


#: writers of a ``status`` field that is not a finding's: a ledger line's verdict in a merged report, an op's
#: row of the release matrix, a fuzz target's outcome
NOT_A_FINDING = {("harness/report/merge.py", "_ledger_lines"), ("harness/report/matrix_md.py", "unbound_ops"),
                 ("harness/run/fuzz.py", "_supervise")}


def test_nothing_but_the_decider_writes_a_findings_status():
    found = set()
    for folder in ("harness", "properties", "distributed_tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for fn, line in _status_writes(path):
                if rel != "harness/run/status.py" and (rel, fn) not in NOT_A_FINDING:
                    found.add(f"{rel}:{line} ({fn})")
    assert not found, "a finding's status is written outside harness/run/status.py: " + ", ".join(sorted(found))
    # the scan sees writes: the decider's own are found
    assert any(True for _ in _status_writes(ROOT / "harness/run/status.py"))

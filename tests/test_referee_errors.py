"""rlconform's own failure to judge a case under the referee (its evaluation of the engine's calls diverged,
the referee failed or stopped answering) is a harness error: status ``error``, named as rlconform's in the
message, no defect row, exit 2 — never the engine's ``crash``. ``tests/bindings/referee_diverges.py`` is a
correct entropy whose worker-side recording is broken the way a harness bug would break it."""

from __future__ import annotations

import json
import os

import forked_cli
import numpy as np
import pytest

from rlconform.harness.run import status
from rlconform.harness.run.referee_verdicts import VerdictBook
from rlconform.properties.case import Case
from rlconform.properties.referee import REFEREE_ERROR

BINDING = os.path.join(os.path.dirname(__file__), "bindings", "referee_diverges.py")
FID = "entropy.matches_reference.float32.moderate"


def _cli(*args, cwd=None):
    return forked_cli.run(args, timeout=600, cwd=cwd)


@pytest.mark.cli
def test_a_diverging_referee_is_a_harness_error_not_an_engine_crash(tmp_path):
    out = tmp_path / "out"
    proc = _cli("check", "--engine", BINDING, "--op", "entropy", "--property", "matches_reference", "--dtype",
                "float32", "--regime", "moderate", "--max-examples", "5", "--out", str(out), "-q")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "not the engine's fault" in proc.stderr
    doc = json.loads((out / "report.json").read_text())
    [finding] = doc["findings"]
    assert finding["status"] == "error", finding
    assert finding["message"].startswith(REFEREE_ERROR) and "diverged" in finding["message"], finding["message"]
    assert not finding.get("severity") and doc.get("defects") == [], doc.get("defects")
    assert finding["examples"] <= 1 and not finding.get("shrink_steps")  # not shrunk: it is not the case's


@pytest.mark.cli
def test_without_the_referee_the_same_engine_passes(tmp_path):
    """The engine is correct: the error above is rlconform's side of the referee's round trip."""
    out = tmp_path / "out"
    proc = _cli("check", "--engine", BINDING, "--op", "entropy", "--property", "matches_reference", "--dtype",
                "float32", "--regime", "moderate", "--max-examples", "3", "--out", str(out), "-q", "--no-referee")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.cli
def test_replay_and_fuzz_exit_2_with_rlconform_named(tmp_path):
    case = Case("entropy", "matches_reference", "float32", "moderate",
                {"logits": np.array([[0.5, -1.0, 2.0], [1.0, 1.0, 0.0]]), "grad_output": np.ones(2)})
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case.to_json()))
    rep = _cli("replay", str(path), "--engine", BINDING)
    assert rep.returncode == 2, rep.stdout[-2000:] + rep.stderr[-2000:]
    assert REFEREE_ERROR in rep.stderr and "CRASH" not in rep.stdout, rep.stdout[-2000:] + rep.stderr[-2000:]
    fz = _cli("fuzz", "--engine", BINDING, "--op", "entropy", "--property", "matches_reference", "--dtype", "float32",
              "--max-examples", "2", "--corpus", str(tmp_path / "corpus"), "--db", str(tmp_path / "db"), "-q",
              cwd=str(tmp_path))
    assert fz.returncode == 2, fz.stdout[-2000:] + fz.stderr[-2000:]
    assert "rlconform's own error" in fz.stderr and "crashed" not in fz.stderr, fz.stderr[-2000:]


def test_the_controller_reads_a_diverged_verdict_as_an_error():
    book = VerdictBook()
    book.add([(FID, "diverged", None, "the engine function f was called outside call_engine")])
    for reported in ("pass", "xpass"):
        entry = {"id": FID, "op": "entropy", "observed": reported, "examples": 1}
        status.decide(entry, verdicts=book)
        assert entry["status"] == "error" and entry["message"].startswith(REFEREE_ERROR), entry
